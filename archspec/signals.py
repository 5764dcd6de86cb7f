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
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_CODES = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}  # 143, 130: the shell's

_received: list[int] = []  # signals turned into Terminated while handlers are installed
_deferring = [0]  # > 0: inside deferred_interrupts(), signals are remembered and raised when it ends


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
        self.previous.clear()

    def __enter__(self) -> "SignalHandlers":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def _raise_terminated(signum: int, _frame) -> None:
    _received.append(signum)
    if _deferring[0]:
        return  # raised when deferred_interrupts() ends
    raise Terminated(f"received {signal.Signals(signum).name}", signum)


@contextmanager
def _holding(raise_after: bool) -> Iterator[None]:
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
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


def raise_if_terminated() -> None:
    """Raise Terminated again if a signal arrived and its exception was swallowed somewhere."""
    if _received:
        signum = _received[-1]
        raise Terminated(f"received {signal.Signals(signum).name}", signum)


__all__ = ["Terminated", "SignalHandlers", "install_signal_handlers", "raise_if_terminated", "deferred_interrupts",
           "interrupts_held", "stop_signals", "received", "EXIT_CODES"]
