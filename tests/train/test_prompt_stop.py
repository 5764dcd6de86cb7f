"""A stop signal ends the console process promptly (issue 48): a stop that something swallows or that hangs (a
compile, a CUDA-graph capture) is forced after ARCHSPEC_STOP_GRACE seconds, a second signal forces it at once, the
stop's own final save is never cut short by a second signal, and a forced stop still leaves the run KILLED with its
resume line. Each case runs in a subprocess of its own (a forced stop ends its interpreter with os._exit); the
`communicate` timeouts are hang guards, not speed limits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.train.test_interrupts import _spec

HANG_GUARD_S = 300


def _start(script: str, tmp_path: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the child never got ready"
        time.sleep(0.05)


SWALLOWER = """
    import pathlib, time
    from archspec.signals import enforce_stop_deadline, install_signal_handlers, last_words, stop_signals

    enforce_stop_deadline({grace})
    said = pathlib.Path("said.txt")
    with install_signal_handlers(stop_signals()), last_words(lambda signum, notes: said.write_text(notes["why"])):
        pathlib.Path("ready").write_text("")
        while True:  # what a library's broad except does to every interrupt
            try:
                time.sleep(0.01)
            except KeyboardInterrupt:
                pathlib.Path("swallowed").write_text("")
"""


def test_a_swallowed_stop_is_forced_after_the_grace(tmp_path):
    proc = _start(SWALLOWER.format(grace=1.0), tmp_path)
    _wait_for(tmp_path / "ready", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 143, err
    assert (tmp_path / "swallowed").exists()  # the first signal was swallowed: only the watchdog could end it
    assert (tmp_path / "said.txt").read_text() == "no clean stop within 1 s"
    assert "stopping now (SIGTERM: no clean stop within 1 s)" in err and "Traceback" not in err


def test_a_second_signal_forces_the_stop_at_once(tmp_path):
    proc = _start(SWALLOWER.format(grace=3600.0), tmp_path)  # the watchdog alone would wait an hour
    _wait_for(tmp_path / "ready", proc)
    proc.send_signal(signal.SIGINT)
    _wait_for(tmp_path / "swallowed", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 130, err
    assert (tmp_path / "said.txt").read_text() == "asked again"
    assert err.strip().splitlines()[-1] == "interrupted"


def test_a_second_signal_during_the_final_save_is_held(tmp_path):
    proc = _start("""
        import os, pathlib, signal, sys, time
        from archspec.signals import enforce_stop_deadline, install_signal_handlers, interrupts_held, stop_signals

        enforce_stop_deadline(3600.0)
        with install_signal_handlers(stop_signals()):
            try:
                pathlib.Path("ready").write_text("")
                time.sleep(3600)
            except KeyboardInterrupt:
                with interrupts_held():  # the stop's own last save
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.2)
                    pathlib.Path("saved").write_text("")
        sys.exit(7)
    """, tmp_path)
    _wait_for(tmp_path / "ready", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 7 and (tmp_path / "saved").exists(), err


def test_in_process_callers_get_no_watchdog():
    from archspec import signals

    assert signals._deadline[0] is None  # pytest is an in-process caller: nothing may os._exit it


@pytest.mark.parametrize("grace", ["0", "-1", "nan", "inf", "soon"])
def test_a_grace_that_is_not_a_positive_number_is_the_default(grace, monkeypatch):
    from archspec.signals import STOP_GRACE_S, stop_grace

    monkeypatch.setenv("ARCHSPEC_STOP_GRACE", grace)
    assert stop_grace() == STOP_GRACE_S


@pytest.mark.slow
def test_a_training_run_stuck_in_a_step_ends_killed_with_its_resume_line(tmp_path, corpus_dir):
    """The H200 case: SIGTERM during the first steps' compile, which swallowed it. Here a step that swallows
    interrupts and never returns stands in for the compile; ARCHSPEC_STOP_GRACE=2 bounds it."""
    spec = _spec(tmp_path, corpus_dir)
    registry = f"sqlite:///{tmp_path}/r.db"
    proc = _start(f"""
        import pathlib, sys, time
        from archspec.train.loop import Trainer

        real = Trainer.train_step

        def stuck(self):
            if self.step < 2:
                return real(self)
            pathlib.Path("ready").write_text("")
            while True:
                try:
                    time.sleep(0.01)
                except KeyboardInterrupt:
                    pass

        Trainer.train_step = stuck
        sys.argv = ["archspec", "train", {str(spec)!r}, "--steps", "5", "--no-compile", "--device", "cpu", "-q",
                    "--set", "train.checkpoint_interval=1", "--run-dir", {str(tmp_path / 'run')!r},
                    "--registry", {registry!r}]
        from archspec.entry import entry
        entry()
    """, tmp_path, ARCHSPEC_STOP_GRACE="2")
    _wait_for(tmp_path / "ready", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 143, err
    assert "resume with: " in err and "--resume" in err, err
    from archspec.registry import Registry

    (run,) = Registry(registry).runs()
    assert run.status == "KILLED" and "no clean stop within 2 s" in (run.error or ""), run
