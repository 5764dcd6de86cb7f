"""Several processes writing one registry: nothing lost, no lock errors, dead writers detected."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from archspec.registry import Registry
from archspec.train.logger import FAILED, FINISHED, KILLED, RUNNING

from .helpers import create_registry, make_info, make_spec

# Several interpreter processes per test: marked slow (pyproject: "multi-process"), still run by plain `pytest`.
pytestmark = pytest.mark.slow

WRITER = Path(__file__).with_name("writer.py")
METRICS_PER_STEP = 3


def spawn(url: str, name: str, seed: int, steps: int, mode: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WRITER), url, name, str(seed), str(steps), mode, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def run_id(name: str, seed: int) -> str:
    return make_info(make_spec(name), seed=seed, data_hash=f"data-{name}").run_id


def test_four_processes_write_concurrently_and_nothing_is_lost(registry_url):
    create_registry(registry_url)  # migrations first, before any worker starts (as the sweep runner does)
    steps = 200
    procs = [spawn(registry_url, f"w{i}", i, steps, "normal", "--flush-every", "6") for i in range(4)]
    reader = Registry(registry_url)
    while any(p.poll() is None for p in procs):  # a reader polls throughout, as a user watching `runs list` would
        reader.runs(where="metrics.loss < 1", sort="-metrics.loss")
        time.sleep(0.02)
    outputs = [p.communicate() for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert out.strip().endswith("done")
        assert "locked" not in err.lower() and "busy" not in err.lower(), err
    assert reader.count_metrics() == 4 * steps * METRICS_PER_STEP
    for i in range(4):
        rid = run_id(f"w{i}", i)
        run = reader.get_run(rid)
        assert run.status == FINISHED
        assert reader.count_metrics(rid) == steps * METRICS_PER_STEP
        assert [p.step for p in reader.metric_history(rid, "loss")] == list(range(steps))
        assert run.steps["loss"] == steps - 1 and run.metrics["tok_s"] == 1000.0 + steps - 1
    reader.close()


def test_kill_9_of_one_writer(registry_url):
    create_registry(registry_url)
    steps = 200
    # The others start first: a run start reaps dead runs, so one that started after the victim went stale (a slow
    # interpreter start on a loaded machine) would mark it KILLED before the test's own reap.
    others = [spawn(registry_url, f"ok{i}", i, steps, "normal") for i in range(2)]
    reg = Registry(registry_url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(reg.run_status(run_id(f"ok{i}", i)) for i in range(2)):
        time.sleep(0.05)
    reg.close()
    victim = spawn(registry_url, "victim", 0, 50, "hang", "--heartbeat-timeout", "1.0")
    line = victim.stdout.readline()
    assert line.startswith("flushed"), victim.stderr.read()
    flushed_total = 50 * METRICS_PER_STEP
    time.sleep(0.2)  # the victim keeps logging into its buffer: those points die with it
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    for p in others:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip().endswith("done"), err
    reg = Registry(registry_url)
    vid = run_id("victim", 0)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # stale once 1 s passed with no beat; a reap marks it KILLED
        if reg.run_state(vid) == (RUNNING, True):
            break
        time.sleep(0.1)
    assert reg.get_run(vid).status == RUNNING  # reading changed nothing
    assert reg.reap() == [vid]
    run = reg.get_run(vid)
    assert run.status == KILLED and "no heartbeat" in run.error
    assert reg.count_metrics(vid) == flushed_total  # what was flushed before the kill is all there
    for i in range(2):
        rid = run_id(f"ok{i}", i)
        assert reg.run_status(rid) == FINISHED and reg.count_metrics(rid) == steps * METRICS_PER_STEP
    reg.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_end_the_run_killed_with_every_buffered_point(registry_url, signum):
    create_registry(registry_url)
    p = spawn(registry_url, "sig", 0, 20, "wait")
    assert p.stdout.readline().startswith("flushed")
    time.sleep(0.3)  # more points pile up in the buffer, unflushed
    p.send_signal(signum)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0, err
    # SIGTERM arrives as Terminated (install_signal_handlers), SIGINT as Python's own KeyboardInterrupt.
    assert ("Terminated" if signum == signal.SIGTERM else "KeyboardInterrupt") in err, err
    with Registry(registry_url) as reg:
        rid = run_id("sig", 0)
        run = reg.get_run(rid)
        assert run.status == KILLED and run.error.startswith("interrupted")
        # end(KILLED) flushed the buffer: more than the 20 flushed steps, and every step complete.
        n = reg.count_metrics(rid)
        assert n > 20 * METRICS_PER_STEP and n % METRICS_PER_STEP == 0


def test_an_exception_ends_the_run_failed_with_the_error(registry_url):
    create_registry(registry_url)
    p = spawn(registry_url, "crash", 0, 10, "raise", "--flush-every", "1000")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "ValueError: boom" in err
    with Registry(registry_url) as reg:
        run = reg.get_run(run_id("crash", 0))
        assert run.status == FAILED and run.error.startswith("ValueError: boom at the last step")
        assert "Traceback" in run.error
        assert reg.count_metrics(run.id) == 9 * METRICS_PER_STEP  # buffered points were flushed by end(FAILED)
