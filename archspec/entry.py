"""The `archspec` console script. It imports the CLI (click, pydantic, SQLAlchemy; torch inside commands) only once
it can answer Ctrl-C: an interrupt at any moment, the imports included, ends with `interrupted` and exit code 130,
never a KeyboardInterrupt traceback."""

# No module-level import: the console script imports this module before entry() can answer Ctrl-C, and even
# `import signal` (which imports enum) takes long enough under load for an interrupt to land inside it. entry()
# imports inside its own `try`.


def _interrupted_while_importing(signum, frame) -> None:
    # No KeyboardInterrupt while the CLI imports: raised inside importlib's own callbacks (a module lock's weakref
    # callback) Python prints it as "Exception ignored ... Traceback" and carries on. Nothing is open yet: leave now.
    import os

    try:
        os.write(2, b"interrupted\n")
    finally:
        os._exit(130)


def entry() -> None:
    import sys

    try:
        import signal

        previous = signal.signal(signal.SIGINT, _interrupted_while_importing)
        from archspec.cli import main
        from archspec.signals import enforce_stop_deadline

        enforce_stop_deadline()  # this process is archspec's own: a stop that hangs is forced (archspec.signals)
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
