"""SIGTERM as an interruption: a run that is told to stop ends KILLED with its record complete, and exits 143.

`install_signal_handlers()` turns SIGTERM into `Terminated` (a KeyboardInterrupt, so every `except KeyboardInterrupt`
that ends a run KILLED on Ctrl-C does the same for SIGTERM). The handler also remembers the signal: code that
swallows the exception (a library's broad `except`, a compile worker) cannot lose it, because the training loop calls
`raise_if_terminated()` before its first step and between steps. The memory is cleared when the handlers are
restored, i.e. once the interruption has been dealt with.

The training loop installs it for SIGINT too (Ctrl-C then raises `Terminated` with exit code 130 and is remembered the
same way: a KeyboardInterrupt swallowed inside torch.compile is raised again between steps), and wraps the optimizer
update in `deferred_interrupts()`: a signal that arrives while the parameters are half-updated is raised as soon as
the update is complete, so the state a checkpoint saves on interruption is always the state after a whole step.

A stop is bounded in time. Python runs a signal handler only between bytecodes of the main thread, and a library may
swallow the exception (torch.compile's workers, a CUDA-graph capture); the console process (`archspec.entry`) therefore
calls `enforce_stop_deadline()`: once a stop signal has arrived, a watchdog thread ends the process after
`ARCHSPEC_STOP_GRACE` seconds (default 20) if it has not ended by itself, and a second signal outside the held,
final save ends it at once. Before it goes, the `last_words` registered by whatever is running (the training loop
marks its run KILLED; `archspec train` prints the resume command) are said, each bounded by the same watchdog's
second chance. In-process callers (tests, notebooks) get no watchdog: it would end their interpreter.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

EXIT_CODES = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}  # 143, 130: the shell's

_received: list[int] = []  # signals turned into Terminated while handlers are installed
_deferring = [0]  # > 0: inside deferred_interrupts(), signals are remembered and raised when it ends
_holding_final = [0]  # > 0: inside interrupts_held(), the stop's own last save: a second signal is held too

STOP_GRACE_S = 20.0  # a stop signal ends the console process within this many seconds (ARCHSPEC_STOP_GRACE)
_deadline: list[float | None] = [None]  # the grace in force, or None: no watchdog (an in-process caller)
_watchdog: list[threading.Timer] = []
_last_words: list[Callable[[int, dict[str, Any]], None]] = []
_forcing = threading.Lock()


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM once `install_signal_handlers()` is in force."""

    def __init__(self, message: str = "received SIGTERM", signum: int = signal.SIGTERM):
        super().__init__(message)
        self.signum = signum

    @property
    def is_interrupt(self) -> bool:
        """Ctrl-C (SIGINT), as opposed to being told to stop (SIGTERM, a scheduler's preemption)."""
        return self.signum == signal.SIGINT

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 128 + self.signum)


class SignalHandlers:
    """The handlers `install_signal_handlers` replaced; `restore()` (or leaving the `with`) puts them back."""

    def __init__(self) -> None:
        self.previous: dict[int, object] = {}

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if self.previous:
            _received.clear()
            while _watchdog:  # the interruption has been dealt with: nothing left to force
                _watchdog.pop().cancel()
        self.previous.clear()

    def __enter__(self) -> "SignalHandlers":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def _raise_terminated(signum: int, _frame) -> None:
    first = not _received
    _received.append(signum)
    if _deadline[0] is not None:
        if first:
            _start_watchdog(signum, _deadline[0])
        elif not _holding_final[0]:
            # Asked twice and still here: the first was swallowed (a compile, a capture) or is taking too long.
            _force_exit(signum, "asked again")
    if _deferring[0]:
        return  # raised when deferred_interrupts() ends
    if _importing(_frame):
        # Inside an import (torch's, say), where C++ may be calling this Python code: an exception raised through it
        # can end the process with std::terminate (SIGABRT, "pybind11::error_already_set"). Remembered instead, and
        # raised at the next check (raise_if_terminated, the end of the command); the watchdog bounds the wait.
        return
    raise Terminated(f"received {signal.Signals(signum).name}", signum)


def _importing(frame) -> bool:
    """Whether the interrupted frame runs inside a module import (importlib's machinery is on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@contextmanager
def _holding(raise_after: bool) -> Iterator[None]:
    _deferring[0] += 1
    _holding_final[0] += not raise_after
    try:
        yield
    finally:
        _deferring[0] -= 1
        _holding_final[0] -= not raise_after
    if raise_after and not _deferring[0]:
        raise_if_terminated()


def deferred_interrupts():
    """A block that a signal handled here must not cut in half (an optimizer update): the signal is remembered and
    raised (as `Terminated`) when the block ends. Only signals `install_signal_handlers` installed are deferred."""
    return _holding(raise_after=True)


def interrupts_held():
    """A block that must finish once the work is already stopping (its last checkpoint, its record): signals handled
    here are remembered but not raised, in it or when it ends (the stop they ask for is under way)."""
    return _holding(raise_after=False)


def stop_signals() -> tuple[int, ...]:
    """The signals that stop archspec: SIGTERM, and SIGINT unless the shell told this process to ignore it (a
    background job)."""
    return (signal.SIGTERM,) if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else (signal.SIGTERM, signal.SIGINT)


def received() -> int | None:
    """The first stop signal received since the handlers were installed (swallowed or not), or None."""
    return _received[0] if _received else None


def install_signal_handlers(signals: tuple[int, ...] = (signal.SIGTERM,)) -> SignalHandlers:
    """Turn SIGTERM (and any other `signals`) into `Terminated` in the main thread.

    SIGINT already raises KeyboardInterrupt. Off the main thread Python cannot install handlers; then nothing is
    installed and the returned object restores nothing. Installing again inside an installed scope is harmless.
    """
    handlers = SignalHandlers()
    if threading.current_thread() is not threading.main_thread():
        return handlers
    for signum in signals:
        handlers.previous[signum] = signal.signal(signum, _raise_terminated)
    return handlers


def stop_grace() -> float:
    """ARCHSPEC_STOP_GRACE (seconds, > 0), else STOP_GRACE_S; a value that is not a positive number is ignored."""
    try:
        value = float(os.environ.get("ARCHSPEC_STOP_GRACE", ""))
    except ValueError:
        return STOP_GRACE_S
    return value if 0 < value < float("inf") else STOP_GRACE_S


def enforce_stop_deadline(seconds: float | None = None) -> None:
    """From now on a stop signal ends this process within `seconds` (default: stop_grace()), and a second one outside
    the final save at once. Only for a process archspec owns (the console script): it calls os._exit."""
    _deadline[0] = stop_grace() if seconds is None else seconds


@contextmanager
def last_words(say: Callable[[int, dict[str, Any]], None]) -> Iterator[None]:
    """What must still be said if a stop has to be forced (the run's KILLED record, the resume command):
    `say(signum, notes)` runs on the watchdog's thread just before the process ends; `notes` is one dict shared by
    every speaker, innermost first (the training loop leaves its checkpoint there for the CLI's resume line)."""
    _last_words.append(say)
    try:
        yield
    finally:
        _last_words.remove(say)


def _start_watchdog(signum: int, seconds: float) -> None:
    timer = threading.Timer(seconds, _force_exit, (signum, f"no clean stop within {seconds:g} s"))
    timer.daemon = True
    _watchdog.append(timer)
    timer.start()


def _force_exit(signum: int, why: str) -> None:
    """End the process now: the last words (bounded: a second timer ends it if they hang), then os._exit with the
    signal's exit code. Any thread; only the first caller proceeds."""
    if not _forcing.acquire(blocking=False):
        return
    code = EXIT_CODES.get(signum, 128 + signum)
    backstop = threading.Timer(10.0, os._exit, (code,))
    backstop.daemon = True
    backstop.start()
    try:
        os.write(2, f"stopping now ({signal.Signals(signum).name}: {why})\n".encode())
    except OSError:
        pass
    notes: dict[str, Any] = {"signum": signum, "why": why}
    for say in reversed(list(_last_words)):
        try:
            say(signum, notes)
        except BaseException:  # noqa: BLE001 - nothing may keep the process from ending now
            pass
    try:
        os.write(2, (b"interrupted\n" if signum == signal.SIGINT else
                     f"terminated (received {signal.Signals(signum).name})\n".encode()))
    finally:
        os._exit(code)


def raise_if_terminated() -> None:
    """Raise Terminated again if a signal arrived and its exception was swallowed somewhere."""
    if _received:
        signum = _received[-1]
        raise Terminated(f"received {signal.Signals(signum).name}", signum)


__all__ = ["Terminated", "SignalHandlers", "install_signal_handlers", "raise_if_terminated", "deferred_interrupts",
           "interrupts_held", "stop_signals", "received", "EXIT_CODES", "enforce_stop_deadline", "last_words",
           "stop_grace", "STOP_GRACE_S"]
