"""The `archspec` console script. It imports the CLI (click, pydantic, SQLAlchemy; torch inside commands) only once
it can answer Ctrl-C: an interrupt at any moment, the imports included, ends with `interrupted` and exit code 130,
never a KeyboardInterrupt traceback."""

from __future__ import annotations

import sys


def entry() -> None:
    try:
        from archspec.cli import main

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
