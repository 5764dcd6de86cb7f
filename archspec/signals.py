"""SIGTERM as an interruption: a run that is told to stop ends KILLED with its record complete, and exits 143.

`install_signal_handlers()` turns SIGTERM into `Terminated` (a KeyboardInterrupt, so every `except KeyboardInterrupt`
that ends a run KILLED on Ctrl-C does the same for SIGTERM). The handler also remembers the signal: code that
swallows the exception (a library's broad `except`, a compile worker) cannot lose it, because the training loop calls
`raise_if_terminated()` before its first step and between steps. The memory is cleared when the handlers are
restored, i.e. once the interruption has been dealt with.
"""

from __future__ import annotations

import signal
import threading

EXIT_CODES = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}  # 143, 130: the shell's

_received: list[int] = []  # signals turned into Terminated while handlers are installed


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM once `install_signal_handlers()` is in force."""

    def __init__(self, message: str = "received SIGTERM", signum: int = signal.SIGTERM):
        super().__init__(message)
        self.signum = signum

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
    raise Terminated(f"received {signal.Signals(signum).name}", signum)


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


__all__ = ["Terminated", "SignalHandlers", "install_signal_handlers", "raise_if_terminated", "EXIT_CODES"]
