"""The `archspec` console script. It imports the CLI (click, pydantic, SQLAlchemy; torch inside commands) only once
it can answer Ctrl-C: an interrupt at any moment, the imports included, ends with `interrupted` and exit code 130,
never a KeyboardInterrupt traceback."""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_importing(signum, frame) -> None:
    # No KeyboardInterrupt while the CLI imports: raised inside importlib's own callbacks (a module lock's weakref
    # callback) Python prints it as "Exception ignored ... Traceback" and carries on. Nothing is open yet: leave now.
    try:
        os.write(2, b"interrupted\n")
    finally:
        os._exit(130)


def entry() -> None:
    try:
        previous = signal.signal(signal.SIGINT, _interrupted_while_importing)
        from archspec.cli import main

        signal.signal(signal.SIGINT, previous)  # from here on the CLI answers Ctrl-C itself
        code = main()
    except KeyboardInterrupt:  # during the imports (inside a command the CLI itself answers it)
        try:
            sys.stderr.write("interrupted\n")
            sys.stderr.flush()
        except (OSError, KeyboardInterrupt):
            pass
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    entry()
