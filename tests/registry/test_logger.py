"""RegistryLogger in one process: batching, heartbeats, ends, signals, busy databases."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import threading
import time

import pytest

from archspec.registry import (
    Registry,
    RegistryLogger,
    RetryPolicy,
    Terminated,
    install_signal_handlers,
    tracked_run,
)
from archspec.train.logger import FAILED, FINISHED, KILLED, RUNNING, RunLogger

from .helpers import make_info


def wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_implements_the_run_logger_protocol(registry):
    assert isinstance(RegistryLogger(registry=registry), RunLogger)


def test_metrics_are_batched_and_end_flushes_the_rest(registry):
    logger = RegistryLogger(registry=registry, flush_every=10, background=False, flush_interval_s=3600)
    info = make_info()
    assert logger.start(info) == info.run_id
    for step in range(9):
        logger.log_metrics(step, {"loss": 1.0})
        logger.heartbeat()
    assert registry.count_metrics(info.run_id) == 0 and logger.buffered == 9
    logger.log_metrics(9, {"loss": 1.0})
    assert registry.count_metrics(info.run_id) == 10 and logger.buffered == 0
    logger.log_metrics(10, {"loss": 0.5, "acc": 0.9})
    logger.log_artifact("checkpoint", "ckpt.pt")
    logger.set_summary({"val_loss": 0.5})
    logger.end(FINISHED)
    logger.end(FINISHED)  # idempotent
    run = registry.get_run(info.run_id)
    assert run.status == FINISHED and registry.count_metrics(info.run_id) == 12
    assert run.summary == {"val_loss": 0.5} and registry.artifacts(info.run_id) == [("checkpoint", os.path.abspath("ckpt.pt"))]
    with pytest.raises(RuntimeError, match="already ended"):
        logger.log_metrics(11, {"loss": 0.1})


def test_misuse_is_reported(registry):
    logger = RegistryLogger(registry=registry, background=False)
    with pytest.raises(RuntimeError, match="start"):
        logger.log_metrics(0, {"loss": 1.0})
    logger.start(make_info())
    with pytest.raises(TypeError, match="metric 'loss' at step 0"):
        logger.log_metrics(0, {"loss": "high"})
    with pytest.raises(ValueError, match="FINISHED, FAILED or KILLED"):
        logger.end("DONE")
    logger.end(FINISHED)


def test_background_thread_flushes_on_time_and_keeps_the_heartbeat(registry):
    logger = RegistryLogger(registry=registry, heartbeat_timeout_s=0.4, flush_interval_s=0.2, flush_every=10**6)
    info = make_info()
    logger.start(info)
    logger.log_metrics(0, {"loss": 1.0, "lr": 0.1})
    assert wait_for(lambda: registry.count_metrics(info.run_id) == 2)
    first = registry.get_run(info.run_id).heartbeat
    # No call from the caller from here on: only the background thread can move the heartbeat. (Waited for, not
    # slept for: a loaded machine may run the thread late, which is not what this test is about.)
    assert wait_for(lambda: registry.get_run(info.run_id).heartbeat > first)
    assert registry.get_run(info.run_id).status == RUNNING
    logger.end(FINISHED)
    assert registry.run_status(info.run_id) == FINISHED


def test_flush_every_wakes_the_background_thread(registry):
    logger = RegistryLogger(registry=registry, flush_every=4, flush_interval_s=3600)
    info = make_info()
    logger.start(info)
    for step in range(4):
        logger.log_metrics(step, {"loss": 1.0})
    assert wait_for(lambda: registry.count_metrics(info.run_id) == 4)
    logger.end(FINISHED)


def test_tracked_run_ends_failed_with_the_error(registry):
    logger = RegistryLogger(registry=registry, background=False)
    info = make_info()
    with pytest.raises(ZeroDivisionError):
        with tracked_run(logger, info):
            logger.log_metrics(0, {"loss": 1.0})
            raise ZeroDivisionError("division by zero")
    run = registry.get_run(info.run_id)
    assert run.status == FAILED and run.error.startswith("ZeroDivisionError: division by zero")
    assert "Traceback" in run.error and registry.count_metrics(info.run_id) == 1


def test_tracked_run_ends_killed_on_keyboard_interrupt_and_finished_otherwise(registry):
    info = make_info(seed=1)
    with pytest.raises(KeyboardInterrupt):
        with RegistryLogger(registry=registry, background=False).run(info):
            raise KeyboardInterrupt
    assert registry.get_run(info.run_id).status == KILLED
    # The same run restarted (KILLED → RUNNING, attempt 2) and finished.
    with RegistryLogger(registry=registry, background=False).run(info) as run_id:
        assert run_id == info.run_id
    run = registry.get_run(info.run_id)
    assert (run.status, run.attempt) == (FINISHED, 2)


def test_sigterm_becomes_terminated_and_handlers_are_restored(registry):
    before = signal.getsignal(signal.SIGTERM)
    info = make_info()
    logger = RegistryLogger(registry=registry, background=False, flush_every=10**6)
    with pytest.raises(Terminated):
        with tracked_run(logger, info):
            logger.log_metrics(0, {"loss": 1.0})
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives long before this ends
    assert signal.getsignal(signal.SIGTERM) is before
    run = registry.get_run(info.run_id)
    assert run.status == KILLED and "SIGTERM" in run.error and registry.count_metrics(info.run_id) == 1
    assert issubclass(Terminated, KeyboardInterrupt)


def test_install_signal_handlers_off_the_main_thread_is_a_no_op():
    result = []
    t = threading.Thread(target=lambda: result.append(install_signal_handlers()))
    t.start()
    t.join()
    assert result[0].previous == {}


def test_a_superseded_logger_stops_writing(registry, caplog):
    info = make_info()
    old = RegistryLogger(registry=registry, background=False, heartbeat_timeout_s=0.05)
    old.start(info)
    time.sleep(0.1)  # its heartbeat is stale now: a new attempt may take the run over
    new = RegistryLogger(registry=registry, background=False)
    assert new.start(info) == info.run_id and new.attempt == 2
    old.log_metrics(0, {"loss": 9.0})
    with caplog.at_level(logging.WARNING, logger="archspec.registry"):
        assert old.flush() == 0
    assert "newer attempt" in caplog.text
    old.end(FAILED, "too late")
    new.log_metrics(0, {"loss": 1.0})
    new.end(FINISHED)
    run = registry.get_run(info.run_id)
    assert run.status == FINISHED and run.metrics == {"loss": 1.0}


def _hold_write_lock(path: str, seconds: float, started: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    started.set()
    time.sleep(seconds)
    conn.execute("ROLLBACK")
    conn.close()


def test_busy_database_is_retried_and_no_point_is_lost(tmp_path, caplog):
    path = tmp_path / "r.db"
    # Short lock waits and a tiny retry budget, so that the flush really gives up while the lock is held.
    reg = Registry(f"sqlite:///{path}", busy_timeout_s=0.01, retry=RetryPolicy(attempts=2, base_s=0.01, max_s=0.01))
    logger = RegistryLogger(registry=reg, background=False, flush_every=5)
    info = make_info()
    logger.start(info)
    started = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(str(path), 0.5, started))
    holder.start()
    started.wait()
    with caplog.at_level(logging.WARNING, logger="archspec.registry"):
        for step in range(5):
            logger.log_metrics(step, {"loss": 1.0})  # the flush fails: the training step must not
    assert "registry busy" in caplog.text and logger.buffered == 5
    holder.join()
    reg.retry = RetryPolicy(attempts=20, base_s=0.01, max_s=0.1)
    logger.end(FINISHED)
    assert reg.count_metrics(info.run_id) == 5 and reg.run_status(info.run_id) == FINISHED


def test_lock_waits_are_retried_until_the_lock_is_released(tmp_path):
    path = tmp_path / "r.db"
    reg = Registry(f"sqlite:///{path}", busy_timeout_s=0.01, retry=RetryPolicy(attempts=50, base_s=0.01, max_s=0.05))
    info = make_info()
    reg.start_run(info, heartbeat_timeout_s=60)
    started = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(str(path), 0.3, started))
    holder.start()
    started.wait()
    t0 = time.monotonic()
    assert reg.write_metrics(info.run_id, 1, [(0, "loss", 1.0, 0.0)])
    assert time.monotonic() - t0 >= 0.2  # it did wait for the lock, through retries
    holder.join()
    assert reg.count_metrics(info.run_id) == 1


def test_a_restarted_run_replaces_history_from_its_first_logged_step(registry):
    info = make_info()
    first = RegistryLogger(registry=registry, background=False)
    first.start(info)
    for step in range(4):
        first.log_metrics(step, {"loss": 10.0 - step})
    first.end(KILLED, "preempted")
    # A resume from the checkpoint at step 2: steps 0-1 stay, 2-3 are rewritten by the new attempt.
    resumed = RegistryLogger(registry=registry, background=False)
    resumed.start(info)
    assert registry.count_metrics(info.run_id) == 4  # nothing lost before the new attempt writes
    for step in (2, 3, 4):
        resumed.log_metrics(step, {"loss": 1.0})
    resumed.end(FINISHED)
    history = [(p.step, p.value) for p in registry.metric_history(info.run_id, "loss")]
    assert history == [(0, 10.0), (1, 9.0), (2, 1.0), (3, 1.0), (4, 1.0)]
    assert registry.get_run(info.run_id).attempt == 2


def test_at_exit_ends_an_open_run_killed_but_not_in_a_forked_child(registry, monkeypatch):
    info = make_info()
    logger = RegistryLogger(registry=registry, background=False)
    logger.start(info)
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as seen from a forked child
    logger._at_exit()
    assert registry.run_status(info.run_id) == RUNNING
    monkeypatch.undo()
    logger._at_exit()
    run = registry.get_run(info.run_id)
    assert run.status == KILLED and "without ending the run" in run.error


def test_a_second_sigterm_does_not_interrupt_the_end_of_the_run():
    from archspec.train.logger import NullLogger

    class SlowEnd(NullLogger):
        finished_end = False

        def end(self, status, error=None):
            os.kill(os.getpid(), signal.SIGTERM)  # the supervisor insists while the run is being ended
            time.sleep(0.2)
            super().end(status, error)
            self.finished_end = True

    logger = SlowEnd()
    with pytest.raises(Terminated):
        with tracked_run(logger, make_info()):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert logger.finished_end and logger.status == KILLED
