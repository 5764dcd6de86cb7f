"""`RegistryLogger`: the training loop's `RunLogger` that writes to the registry.

How the loop uses it (this is what `tracked_run` does, for a loop that prefers one `with`):

    logger = RegistryLogger(url)                        # or RegistryLogger() for $ARCHSPEC_REGISTRY / the default
    if logger.registry.run_status(info.run_id) == FINISHED:
        ...                                             # a sweep skips it; start() would raise RunFinishedError
    handlers = install_signal_handlers()                # SIGTERM → Terminated, a KeyboardInterrupt
    run_id = logger.start(info)                         # RUNNING; restarts a FAILED/KILLED/SCHEDULED run afresh
    try:
        for step in ...:
            logger.log_metrics(step, {"train/loss": loss, "lr": lr})   # microseconds: appends to a buffer
            logger.heartbeat()                          # cheap; call it as often as you like
        logger.set_summary({"val/loss": best})
        logger.end(FINISHED)
    except KeyboardInterrupt as e:                      # SIGINT, or SIGTERM through install_signal_handlers
        logger.end(KILLED, f"interrupted: {e!r}")
        raise
    except Exception as e:
        logger.end(FAILED, error_text(e))
        raise
    finally:
        handlers.restore()

`tracked_run(logger, info)` does all of the above in one `with`, and also keeps a second SIGTERM from interrupting
`end()` while it flushes.

Writes: metric points are buffered and written in batches (every `flush_every` points or `flush_interval_s`
seconds, whichever first, and at end()), each batch in one transaction that also beats the heartbeat. With
`background=True` (default) a daemon thread does the timed flushes and heartbeats, so a step that takes minutes
(torch.compile) does not look like a dead run, and the training thread never waits on the database; a process that
dies (kill -9) stops beating; once `heartbeat_timeout_s` has passed, reads show it stale and the next reap (a run
start, a sweep, `archspec runs reap`) marks it KILLED. Points
flushed before that are kept; points still in the buffer are lost, which is what `flush_interval_s` bounds.

A restart (same run id after FAILED/KILLED, or a resume from a checkpoint) is a new attempt: `attempt` goes up, and
its first write replaces the history from its first logged step on (a restart from step 0 replaces all of it, a
resume at step k keeps steps < k). A logger whose attempt was superseded by a newer one stops writing (warning).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Iterator, Mapping

from archspec.errors import UserError
from archspec.registry.store import Registry, RegistryBusyError
from archspec.signals import SignalHandlers, Terminated, install_signal_handlers
from archspec.train.logger import FAILED, FINISHED, KILLED, RecordingError, RunInfo, RunLogger, repeat_id

log = logging.getLogger("archspec.registry")


def error_text(exc: BaseException, limit: int = 20_000) -> str:
    """`Type: message` on the first line (what `runs list` shows), then the traceback (what `runs show` shows)."""
    head = f"{type(exc).__name__}: {exc}".strip()
    tb = "".join(traceback.format_exception(exc))
    text = f"{head}\n\n{tb}"
    return text if len(text) <= limit else text[:2000] + "\n...\n" + text[-(limit - 2000):]


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)  # a DBAPIError: the driver's own words ("database or disk is full")
    text = str(orig if orig is not None else exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _unwritable(exc: BaseException) -> bool:
    """A write failure that waiting will not fix (disk full, read-only, I/O error, dropped table), as opposed to a busy
    database, which the store already retried, or a UserError (a run already RUNNING elsewhere)."""
    from sqlalchemy.exc import SQLAlchemyError

    return isinstance(exc, (SQLAlchemyError, OSError, RegistryBusyError)) and not isinstance(exc, UserError)


class RegistryLogger:
    """The `RunLogger` that records a run in the registry. See the module docstring for how the loop calls it.

    url: registry URL (None: `default_url()`); or pass an open `registry`.
    heartbeat_timeout_s: a reader marks this run KILLED when no heartbeat came for this long (stored on the run).
    heartbeat_interval_s: how often the heartbeat is written (default: a quarter of the timeout, at most 30 s).
    flush_every: buffered metric points that trigger a write. flush_interval_s: the longest a point waits.
    background: heartbeats and timed flushes from a daemon thread (True), or only from the loop's calls (False).
    rerun_finished: an explicit request to train again (`archspec train`): `repeat_for` gives a FINISHED run's
        repeat a run id of its own (`repeat_id`), so the finished run is kept whole; without it a FINISHED run raises
        RunFinishedError (sweeps skip those).
    take_over: start() on a RUNNING run with a fresh heartbeat restarts it (its writer is known to be dead: `kill -9`
    on another machine; on this host the registry checks the writer's pid by itself).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        heartbeat_timeout_s: float = 120.0,
        heartbeat_interval_s: float | None = None,
        flush_every: int = 256,
        flush_interval_s: float = 5.0,
        background: bool = True,
        rerun_finished: bool = False,
        take_over: bool = False,
        max_buffer: int = 100_000,
        registry: Registry | None = None,
    ):
        if heartbeat_timeout_s <= 0 or flush_every < 1 or flush_interval_s <= 0:
            raise ValueError("heartbeat_timeout_s and flush_interval_s must be > 0 and flush_every >= 1")
        self.registry = registry if registry is not None else Registry(url)
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.heartbeat_interval_s = float(heartbeat_interval_s or min(30.0, heartbeat_timeout_s / 4))
        self.flush_every = int(flush_every)
        self.flush_interval_s = float(flush_interval_s)
        self.background = background
        self.rerun_finished = rerun_finished
        self.take_over = take_over
        self.max_buffer = max(max_buffer, flush_every)

        self.run_id: str | None = None
        self.attempt = 0
        self._buf: list[tuple[int, str, float, float]] = []
        self._buf_lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one write of metrics at a time (loop thread vs background thread)
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._last_flush = self._last_beat = 0.0
        self._ended = False
        self._superseded = False
        self._replacing = False
        self._pid = 0
        self._warned_at = 0.0
        self._failure: str | None = None  # why the registry cannot be written; every later call raises RecordingError

    # ── RunLogger ────────────────────────────────────────────────────────────────────────────────────────────────

    def repeat_for(self, run_id: str) -> int:
        """Which repeat a fresh (not resumed) run of `run_id`'s experiment is recorded as: 0 (the run itself) unless
        it FINISHED and this logger trains again on request, then the first repeat (`repeat_id`) that has not
        finished. A read: a missing registry has no runs."""
        if not self.rerun_finished:
            return 0
        n = 0
        while self.registry.run_status(repeat_id(run_id, n) if n else run_id) == FINISHED:
            n += 1
        return n

    def recorded_status(self, run_id: str) -> str | None:
        """The status the registry holds for `run_id` (None: not recorded). A read."""
        return self.registry.run_status(run_id)

    def start(self, info: RunInfo) -> str:
        if self.run_id is not None:
            raise RuntimeError("RegistryLogger.start() called twice; use one logger per run")
        try:
            self.attempt = self.registry.start_run(
                info, heartbeat_timeout_s=self.heartbeat_timeout_s, rerun_finished=self.rerun_finished,
                take_over=self.take_over,
            )
        except Exception as e:
            if _unwritable(e):
                raise RecordingError(f"registry {self.registry.url}: cannot record run {info.run_id}: {_reason(e)}") \
                    from None
            raise
        # A restart replaces the history from its first logged step on, at its first write (see Registry.start_run).
        self._replacing = self.attempt > 1
        self._pid = os.getpid()
        self.run_id = info.run_id
        self._last_flush = self._last_beat = time.monotonic()
        atexit.register(self._at_exit)
        if self.background:
            self._thread = threading.Thread(target=self._background, name=f"archspec-registry-{self.run_id}",
                                            daemon=True)
            self._thread.start()
        return self.run_id

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._check_running()
        self._raise_failure()
        now = time.time()
        points = []
        for key, value in metrics.items():
            try:
                points.append((int(step), str(key), float(value), now))
            except (TypeError, ValueError):
                raise TypeError(f"metric {key!r} at step {step}: expected a number, got {value!r}") from None
        with self._buf_lock:
            self._buf.extend(points)
            size = len(self._buf)
        if size >= self.max_buffer:
            self._flush_or_keep()  # back-pressure: the database has not kept up; write from the loop thread
        elif size >= self.flush_every:
            if self._thread is not None:
                self._wake.set()
            else:
                self._flush_or_keep()
        elif self._thread is None and time.monotonic() - self._last_flush >= self.flush_interval_s:
            self._flush_or_keep()

    def heartbeat(self) -> None:
        self._check_running()
        self._raise_failure()
        if self._thread is not None:
            return  # the background thread beats on its own clock
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat_interval_s or (
            self._buf and now - self._last_flush >= self.flush_interval_s
        ):
            self._flush_or_keep()  # a flush is a heartbeat, with or without points

    def log_artifact(self, kind: str, path: str) -> None:
        self._check_running()
        if not self._superseded:
            with self._recording("record an artifact of"):
                self.registry.add_artifact(self.run_id, kind, str(path))  # type: ignore[arg-type]

    def set_summary(self, metrics: Mapping[str, float]) -> None:
        self._check_running()
        if not self._superseded:
            with self._recording("record the summary of"):
                self.registry.set_summary(self.run_id, {k: float(v) for k, v in metrics.items()})  # type: ignore[arg-type]

    def end(self, status: str, error: str | None = None) -> None:
        """Flush everything and set the final status; a second call does nothing."""
        if self._ended:
            return
        if self.run_id is None:
            raise RuntimeError("RegistryLogger.end() before start()")
        if status not in (FINISHED, FAILED, KILLED):
            raise ValueError(f"end(status): expected FINISHED, FAILED or KILLED, got {status!r}")
        self._stop_thread()
        # The final flush gets three full retry rounds: losing the tail of a run is worse than a slow exit. When the
        # registry cannot be written at all, the status is still tried (a row update may fit where points did not);
        # either failure ends the logger and is reported as a RecordingError, never as the driver's traceback.
        problem = None
        for round_ in range(3):
            try:
                self.flush()
                break
            except Exception as e:
                if not _unwritable(e):
                    raise
                if not isinstance(e, RegistryBusyError) or round_ == 2:
                    problem = f"{self.buffered} metric points not written: {_reason(e)}"
                    break
        if problem and status == FINISHED:  # a run whose record lost its tail is not a finished record
            status, error = FAILED, f"the registry refused the final write: {problem}"
        try:
            if not self._superseded:
                self.registry.finish_run(self.run_id, self.attempt, status, error)
        except Exception as e:
            if not _unwritable(e):
                raise
            problem = f"status {status} not written: {_reason(e)}" + (f"; {problem}" if problem else "")
        self._ended = True
        atexit.unregister(self._at_exit)
        if problem:
            raise RecordingError(f"registry {self.registry.url}: run {self.run_id}: {problem}")

    # ── extras ───────────────────────────────────────────────────────────────────────────────────────────────────

    def flush(self) -> int:
        """Write the buffered points now (also a heartbeat). Returns how many were written."""
        if self.run_id is None:
            return 0
        with self._flush_lock:
            with self._buf_lock:
                batch, self._buf = self._buf, []
            if self._superseded:
                return 0
            replace_from = None
            if self._replacing and batch:
                replace_from = min(step for step, *_ in batch)
            try:
                alive = self.registry.write_metrics(self.run_id, self.attempt, batch, replace_from_step=replace_from)
            except BaseException as e:
                with self._buf_lock:  # nothing was written: keep the points for the next try, in order
                    self._buf[:0] = batch
                if _unwritable(e) and not isinstance(e, RegistryBusyError):
                    self._failure = self._failure or _reason(e)
                raise
            self._last_flush = self._last_beat = time.monotonic()
            if replace_from is not None:
                self._replacing = False
            if not alive:
                self._superseded = True
                log.warning("run %s: a newer attempt took this run over; this process stops recording it",
                            self.run_id)
                return 0
            return len(batch)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @contextmanager
    def run(self, info: RunInfo, handle_signals: bool = True) -> Iterator[str]:
        """`with logger.run(info) as run_id:` — start, and end FINISHED / FAILED / KILLED by how the block exits."""
        with tracked_run(self, info, handle_signals=handle_signals) as run_id:
            yield run_id

    # ── internals ────────────────────────────────────────────────────────────────────────────────────────────────

    def _check_running(self) -> None:
        if self.run_id is None:
            raise RuntimeError("RegistryLogger: call start(info) first")
        if self._ended:
            raise RuntimeError(f"run {self.run_id} already ended")

    def _flush_or_keep(self) -> None:
        """Flush from the loop thread; when the database stays busy, keep the points and warn (at most once a
        minute) instead of failing the training step. end() insists. A registry that cannot be written at all
        (disk full) is remembered: the next call from the loop raises RecordingError, so the run stops early."""
        try:
            self.flush()
        except RegistryBusyError as e:
            self._warn(f"run {self.run_id}: metrics kept in memory, registry busy: {e}")
        except Exception as e:
            if not _unwritable(e):
                raise
            self._failure = _reason(e)
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RecordingError(f"registry {self.registry.url}: cannot record run {self.run_id}: {self._failure}")

    @contextmanager
    def _recording(self, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:
            if not _unwritable(e):
                raise
            self._failure = self._failure or _reason(e)
            raise RecordingError(f"registry {self.registry.url}: cannot {what} run {self.run_id}: {_reason(e)}") \
                from None

    def _warn(self, message: str) -> None:
        if time.monotonic() - self._warned_at > 60:
            self._warned_at = time.monotonic()
            log.warning(message)

    def _background(self) -> None:
        while not self._stop:
            now = time.monotonic()
            wait = self.heartbeat_interval_s - (now - self._last_beat)
            if self._buf:
                wait = min(wait, self.flush_interval_s - (now - self._last_flush))
            self._wake.wait(max(0.01, wait))
            self._wake.clear()
            if self._stop:
                return
            now = time.monotonic()
            try:
                due = len(self._buf) >= self.flush_every or now - self._last_flush >= self.flush_interval_s
                if self._buf and due:
                    self.flush()
                elif now - self._last_beat >= self.heartbeat_interval_s:
                    with self._flush_lock:
                        if not self._superseded and not self.registry.beat(self.run_id, self.attempt):  # type: ignore[arg-type]
                            self._superseded = True
                        self._last_beat = time.monotonic()
            except Exception as e:  # never let the thread die: try again after a pause, not in a hot loop
                if _unwritable(e) and not isinstance(e, RegistryBusyError):
                    self._failure = _reason(e)  # disk full, read-only: the loop's next call stops the run
                self._warn(f"run {self.run_id}: background registry write failed, will retry: {_reason(e)}")
                self._wake.wait(min(5.0, self.heartbeat_interval_s))
                self._wake.clear()
            if self._superseded:
                return

    def _stop_thread(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _at_exit(self) -> None:
        # The interpreter is exiting with the run still open (an uncaught exception, sys.exit in the loop): record
        # that rather than leave it RUNNING until its heartbeat times out.
        if self.run_id is not None and not self._ended and os.getpid() == self._pid:  # not in a forked child
            try:
                self.end(KILLED, "the process exited without ending the run")
            except Exception as e:  # pragma: no cover - nothing left to report to
                log.warning("run %s: could not record the end of the run: %s", self.run_id, e)


@contextmanager
def _ending(handlers: SignalHandlers) -> Iterator[None]:
    """While the run is being ended, a second SIGTERM must not interrupt the final flush: ignore it until done (the
    first one is re-raised right after, so the process still exits)."""
    if not handlers.previous:
        yield
        return
    ignored = {signum: signal.signal(signum, signal.SIG_IGN) for signum in handlers.previous}
    try:
        yield
    finally:
        for signum, handler in ignored.items():
            signal.signal(signum, handler)


@contextmanager
def tracked_run(logger: RunLogger, info: RunInfo, *, handle_signals: bool = True) -> Iterator[str]:
    """Start `info` on any RunLogger and end it by how the block exits: FINISHED; KILLED on KeyboardInterrupt
    (Ctrl-C, and SIGTERM when `handle_signals`); FAILED with the traceback on an exception."""
    handlers = install_signal_handlers() if handle_signals else SignalHandlers()
    try:
        run_id = logger.start(info)
        try:
            yield run_id
        except KeyboardInterrupt as e:
            with _ending(handlers):
                logger.end(KILLED, f"interrupted: {e}" if str(e) else "interrupted (SIGINT)")
            raise
        except Exception as e:
            with _ending(handlers):
                logger.end(FAILED, error_text(e))
            raise
        except BaseException as e:  # SystemExit, GeneratorExit: the run did not finish, nor did it fail by itself
            with _ending(handlers):
                logger.end(KILLED, f"stopped: {type(e).__name__}: {e}")
            raise
        else:
            with _ending(handlers):
                logger.end(FINISHED)
    finally:
        handlers.restore()


__all__ = ["RegistryLogger", "Terminated", "install_signal_handlers", "tracked_run", "error_text"]
