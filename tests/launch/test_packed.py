"""Several runs per device (archspec.launch.packed): the scheduling with fake jobs (slots never oversubscribed, a
failed job does not stop the others, an interruption stops every child), `auto` from the memory plan, the option's
refusals, and (slow) a packed sweep recording the same losses as the same runs trained one at a time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.cli import main
from archspec.launch.base import Died, Payload, Resources, WorkerResult
from archspec.launch.packed import (
    CONTEXT_BYTES,
    MAX_JOBS_PER_DEVICE,
    Slot,
    child_env,
    jobs_per_device,
    parse_jobs_per_device,
    payload_from_json,
    payload_json,
    run_packed,
    slots_for,
)


class Clock:
    """The fake time the scheduler's pause() advances; records how many fake jobs run on each device at each tick."""

    def __init__(self, interrupt_at: int | None = None):
        self.now, self.interrupt_at = 0, interrupt_at
        self.children: list[FakeChild] = []

    def pause(self) -> None:
        self.now += 1
        if self.interrupt_at is not None and self.now == self.interrupt_at:
            raise KeyboardInterrupt

    def running(self) -> list["FakeChild"]:
        return [c for c in self.children if c.outcome_now() is None]


class FakeChild:
    def __init__(self, clock: Clock, job: tuple[int, int, str], slot, obeys_terminate: bool = True):
        self.clock, (self.number, self.ticks, self.fate), self.slot = clock, job, slot
        self.started, self.obeys = clock.now, obeys_terminate
        self.terminated = self.killed = False

    def outcome_now(self):
        if self.killed or (self.terminated and self.obeys):
            return Died("stopped")
        if self.clock.now - self.started < self.ticks:
            return None
        if self.fate == "died":
            return Died("exit code 1 with no result")
        return WorkerResult(f"run{self.number}", "FAILED" if self.fate == "failed" else "FINISHED")

    def poll(self):
        return self.outcome_now()

    def terminate(self):
        self.terminated = True

    def kill(self):
        self.killed = True


def starter(clock: Clock, obeys_terminate: bool = True, peak: dict | None = None):
    def start(job, slot):
        if job[2] == "unstartable":
            raise OSError("no such file")
        if peak is not None:  # what runs at the moment this one starts, per device, this one included
            for device in {c.slot.device for c in clock.running()} | {slot.device}:
                n = sum(c.slot.device == device for c in clock.running()) + (slot.device == device)
                peak[device] = max(peak.get(device, 0), n)
            busy = {c.slot for c in clock.running()}
            assert slot not in busy, "a job started on a busy slot"
        child = FakeChild(clock, job, slot, obeys_terminate)
        clock.children.append(child)
        return child
    return start


jobs_strategy = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["ok", "ok", "failed", "died", "unstartable"])),
                         min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(jobs=jobs_strategy, devices=st.integers(1, 3), per_device=st.integers(1, 4))
def test_every_job_runs_once_and_no_device_holds_more_than_n(jobs, devices, per_device):
    clock, peak = Clock(), {}
    numbered = [(i, ticks, fate) for i, (ticks, fate) in enumerate(jobs)]
    slots = slots_for([str(d) for d in range(devices)], per_device)
    outcomes = run_packed(numbered, slots, starter(clock, peak=peak), pause=clock.pause)
    assert len(outcomes) == len(jobs)
    assert all(v <= per_device for v in peak.values())
    started = [c.number for c in clock.children]
    assert sorted(started) == [i for i, (_, fate) in enumerate(jobs) if fate != "unstartable"]  # each once
    for (i, (_, fate)), out in zip(enumerate(jobs), outcomes):  # in the jobs' order, each its own fate
        if fate in ("ok", "failed"):
            assert isinstance(out, WorkerResult) and out.run_id == f"run{i}"
            assert out.status == ("FINISHED" if fate == "ok" else "FAILED")
        else:
            assert isinstance(out, Died) and (fate != "unstartable" or "could not start" in out.reason)
    # work-conserving: with as many slots as jobs, every startable job starts at tick 0
    if len(slots) >= len(jobs):
        assert all(c.started == 0 for c in clock.children)


def test_jobs_spread_over_devices_before_doubling_up():
    clock, numbered = Clock(), [(i, 3, "ok") for i in range(2)]
    run_packed(numbered, slots_for(["0", "1"], 2), starter(clock), pause=clock.pause)
    assert [c.slot.device for c in clock.children] == ["0", "1"]


@pytest.mark.parametrize("obeys", [True, False])
def test_an_interruption_stops_every_running_child_and_starts_no_more(obeys):
    clock = Clock(interrupt_at=2)
    numbered = [(i, 10, "ok") for i in range(6)]
    with pytest.raises(KeyboardInterrupt):
        run_packed(numbered, slots_for([None], 3), starter(clock, obeys_terminate=obeys), pause=clock.pause,
                   stop_wait_s=0.0 if not obeys else 5.0)
    assert len(clock.children) == 3  # the queued three never started
    assert all(c.terminated for c in clock.children)  # each was asked to stop (SIGTERM: its run ends KILLED)
    assert all(c.killed != obeys for c in clock.children)  # killed only when it did not stop in time


def test_a_child_is_pinned_to_its_gpu_with_its_share_of_the_cores():
    env = child_env({"PATH": "/bin"}, Slot("3", 1), slots=4, cpus=16)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["OMP_NUM_THREADS"] == "4" and env["PATH"] == "/bin"
    assert child_env({"OMP_NUM_THREADS": "2"}, Slot("0", 0), slots=4, cpus=16)["OMP_NUM_THREADS"] == "2"  # as set
    assert child_env({}, Slot("0", 0), slots=32, cpus=16)["OMP_NUM_THREADS"] == "1"
    cpu = child_env({"PATH": "/bin"}, Slot(None, 0), slots=2, cpus=2)  # CPU: as a run alone has it
    assert cpu == {"PATH": "/bin"}


def test_no_slots_is_an_error():
    with pytest.raises(ValueError):
        run_packed([1], [], lambda job, slot: None)


# ── how many ──


def test_auto_is_one_on_cpu_with_the_reason():
    n, why = jobs_per_device("auto", "cpu", [10 << 20])
    assert n == 1 and "CPU" in why


@settings(max_examples=200, deadline=None)
@given(plans=st.lists(st.integers(0, 80 << 30), min_size=1, max_size=4),
       free=st.lists(st.integers(0, 200 << 30), min_size=1, max_size=8))
def test_auto_on_cuda_fits_the_largest_plan_in_the_least_free_device(plans, free):
    n, why = jobs_per_device("auto", "cuda", plans, free)
    per_job = max(plans) + CONTEXT_BYTES
    assert 1 <= n <= MAX_JOBS_PER_DEVICE and f"auto = {n}" in why
    assert n == 1 or n * per_job <= min(free)  # more than one only when they all fit
    assert n == MAX_JOBS_PER_DEVICE or (n + 1) * per_job > min(free)  # and no fewer than fit


def test_a_number_is_taken_as_given():
    assert jobs_per_device(3, "cpu", [1]) == (3, "--jobs-per-device 3")


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("AUTO", "auto"), ("1", 1), ("64", 64)])
def test_parse_jobs_per_device(text, value):
    assert parse_jobs_per_device(text) == value


@pytest.mark.parametrize("text", ["0", "65", "-1", "two", "", "1.5"])
def test_parse_jobs_per_device_refuses(text):
    with pytest.raises(ValueError):
        parse_jobs_per_device(text)


def test_the_payload_travels_as_json():
    p = Payload(spec={"name": "x", "model": {"d_model": 8}}, run_id="abc", registry_url="sqlite:////tmp/r.db",
                compile=False, membership={"sweep": "s", "variant": 1}, log_to=["jsonl"],
                resources=Resources(gpus=1, mem_mb=5000))
    assert payload_from_json(payload_json(p)) == p


@pytest.mark.parametrize("extra, message", [
    (["--jobs-per-device", "0"], "Invalid value for '--jobs-per-device'"),
    (["--jobs-per-device", "many"], "Invalid value for '--jobs-per-device'"),
    (["--jobs-per-device", "2", "--launcher", "slurm-local"], "--jobs-per-device packs runs on this machine"),
])
def test_refusals_exit_2_with_one_line(workdir, base_spec, extra, message, capsys):
    import yaml

    path = workdir / "mini.yaml"
    path.write_text(yaml.safe_dump({"name": "mini", "base": base_spec, "seeds": [0], "budget": {"steps": 2},
                                    "grid": {"model.norm.kind": ["rmsnorm"]}}))
    assert main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'r.db'}", "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# ── end to end ──


@pytest.mark.slow
def test_a_packed_sweep_records_the_losses_of_the_runs_trained_alone(workdir, base_spec, capsys):
    """Two jobs at once on the CPU, each its own process, row and seed: every step's train loss and every val loss
    equal to the same runs trained one at a time in this process (run ids are content keys: the same in both)."""
    import yaml

    from archspec.registry import Registry

    path = workdir / "mini.yaml"
    path.write_text(yaml.safe_dump({"name": "mini", "base": base_spec, "seeds": [0, 1], "budget": {"steps": 4},
                                    "grid": {"model.norm.kind": ["rmsnorm"]}}))
    alone, packed = f"sqlite:///{workdir / 'alone.db'}", f"sqlite:///{workdir / 'packed.db'}"
    args = ["ablate", str(path), "--no-compile", "--device", "cpu", "--json"]
    assert main([*args, "--registry", alone]) == 0
    assert main([*args, "--registry", packed, "--jobs-per-device", "2"]) == 0
    err = capsys.readouterr().err
    assert "--jobs-per-device 2; 1 device(s): up to 2 job(s) at once" in err and "cpu slot 1" in err

    def curves(url):
        reg = Registry(url)
        return {r.id: ([p.value for p in reg.metric_history(r.id, "train_loss")],
                       [p.value for p in reg.metric_history(r.id, "val_loss")], r.seed, r.status)
                for r in reg.runs(where="sweep = 'mini'")}

    here, there = curves(alone), curves(packed)
    assert len(here) == 2 and here.keys() == there.keys()
    assert {c[2] for c in there.values()} == {0, 1}  # its own seed each
    for run_id, curve in here.items():
        assert there[run_id] == curve and len(curve[0]) == 4 and curve[3] == "FINISHED"


@pytest.mark.slow
def test_ctrl_c_stops_every_packed_child_and_their_runs_end_killed(workdir, base_spec):
    """SIGINT to `archspec ablate --jobs-per-device 2` while both runs train: the command ends, each child was told to
    stop and recorded its run KILLED, and no child is left running."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    from archspec.registry import Registry

    path = workdir / "long.yaml"
    path.write_text(yaml.safe_dump({"name": "long", "base": base_spec, "seeds": [0, 1], "budget": {"steps": 100_000},
                                    "grid": {"model.norm.kind": ["rmsnorm"]}}))
    url = f"sqlite:///{workdir / 'r.db'}"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "archspec", "ablate", str(path), "--registry", url, "--device",
                             "cpu", "--no-compile", "--jobs-per-device", "2"], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240  # a hang guard, not a timing assertion
        rows = []
        while time.monotonic() < deadline and proc.poll() is None:
            rows = Registry(url).runs(where="sweep = 'long'") if (workdir / "r.db").exists() else []
            if len(rows) == 2 and all(r.status == "RUNNING" and r.summary is not None for r in rows) and all(
                    (workdir / "runs").rglob("*.log")):
                if all(Registry(url).metric_history(r.id, "train_loss") for r in rows):  # both are stepping
                    break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    rows = Registry(url).runs(where="sweep = 'long'")
    assert sorted(r.status for r in rows) == ["KILLED", "KILLED"], err[-3000:]
    for r in rows:  # "pid N on cpu slot K": the child is gone
        pid = int(r.scheduler_job.split()[1])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
