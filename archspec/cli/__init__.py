"""The `archspec` command line. Every bad input ends in exit code 2 with a message, never a traceback."""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
import warnings

import click

from archspec.errors import Note, UserError, printable
from archspec.signals import (
    Terminated,
    install_signal_handlers,
    raise_if_terminated,
    received,
    stop_signals,
)
from archspec.train.logger import RecordingError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="archspec")
def cli() -> None:
    """Compile decoder-only transformer specs into PyTorch modules, train them, and query the runs."""


# One module of archspec/cli per command family; each defines its click commands as `<name>_cmd` and calls into the
# package that does the work (build → codegen, train → train, runs/specs/registry → registry, ...).
_SUBCOMMANDS = [
    ("archspec.cli.build", ["build", "check", "schema"]),
    ("archspec.cli.train", ["train", "peak"]),
    ("archspec.cli.registry", ["runs", "specs", "registry", "gc"]),
    ("archspec.cli.ablate", ["ablate", "report"]),
    ("archspec.cli.hf", ["import-hf", "export-hf"]),
    ("archspec.cli.sample", ["sample"]),
    ("archspec.cli.probe", ["probe"]),
    ("archspec.cli.scaling", ["scaling"]),
    ("archspec.cli.ui", ["ui"]),
]


def _register() -> None:
    for module_name, names in _SUBCOMMANDS:
        module = importlib.import_module(module_name)
        for name in names:
            cli.add_command(getattr(module, name.replace("-", "_") + "_cmd"), name)


_register()


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("default", Note)  # each distinct note (SpecNote, Caution, ...) once per command
        python_shows = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None) -> None:
            """A spec's note (an old spelling, a changed default) as one `note:` line on stderr; other warnings as
            Python shows them."""
            if issubclass(category, Note):
                click.echo(f"{category.prefix}: {printable(str(message))}", err=True)
            else:
                python_shows(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        # Ctrl-C and SIGTERM are remembered for the whole command, so one that a library swallowed (a half-finished
        # import, a broad `except`) still ends it as an interruption, never as the error it left behind.
        with install_signal_handlers(stop_signals()):
            return _main(argv)


def check_argv(argv: list[str]) -> None:
    """Every argument is text archspec can keep: a NUL byte cannot be a path or a value (only an in-process caller can
    pass one), and bytes that are not UTF-8 (Python hands them over as lone surrogates) could be neither printed nor
    stored in the registry. Refused here, once, for every command and option, naming the argument."""
    for i, arg in enumerate(argv):
        problem = "holds a NUL byte" if "\0" in arg else None
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as e:
            problem = f"is not UTF-8 text (at character {e.start})"
        if problem:
            before = argv[i - 1] if i and argv[i - 1].startswith("-") and "=" not in argv[i - 1] else None
            where = f"the value of {printable(before, 40)}" if before else f"argument {i + 1}"
            raise UserError(f"{where} ({printable(arg, 60)}) {problem}; archspec takes UTF-8 text and paths")


def check_working_directory() -> None:
    """Relative paths are resolved against the working directory and stored, so it is checked like the arguments.
    (The path variables are checked where they are read: archspec.paths, and the registry URL in its engine.)"""
    try:
        cwd = os.getcwd()
    except OSError as e:  # removed under us
        raise UserError(f"the working directory is gone ({e.strerror}); cd somewhere that exists") from None
    try:
        cwd.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"the working directory ({printable(cwd, 80)}) is not UTF-8 text; archspec stores the paths "
                        "it derives from it as UTF-8") from None


def _main(argv: list[str] | None) -> int:
    try:
        check_argv(list(sys.argv[1:] if argv is None else argv))
        check_working_directory()
        # Without standalone mode click returns a command's exit code (from ctx.exit / Exit) instead of exiting.
        rc = cli.main(args=argv, prog_name="archspec", standalone_mode=False)
        raise_if_terminated()  # swallowed on the way, and the command finished anyway: it was still interrupted
    except UserError as e:
        click.echo(f"error: {e.render()}", err=True)
        return 2
    except click.exceptions.Abort as e:
        # click turns KeyboardInterrupt (Ctrl-C, and SIGTERM through archspec.signals) into Abort
        cause = e.__cause__ or e.__context__
        if isinstance(cause, Terminated):
            click.echo("interrupted" if cause.is_interrupt else f"terminated ({cause})", err=True)
            return cause.exit_code  # 143 for SIGTERM, 130 for SIGINT, as the shell reports a process it killed
        click.echo("aborted", err=True)
        return 130
    except RecordingError as e:  # the registry cannot be written (disk full, read-only): not bad input, exit 1
        click.echo(f"error: {printable(str(e))}", err=True)
        return 1
    except Terminated as e:  # raised outside click's own handling
        click.echo("interrupted" if e.is_interrupt else f"terminated ({e})", err=True)
        return e.exit_code
    except OSError as e:
        if received() is None:
            return _os_error(e)
        return _stopped(received())
    except click.ClickException as e:
        e.message = printable(e.message)  # user text inside (a path, an option) cannot forge terminal lines
        e.show()
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except Exception:
        if received() is not None:  # whatever broke did so because the interrupt cut something short
            return _stopped(received())
        raise
    return rc if isinstance(rc, int) else 0


# The machine, not the input: a full disk, a read-only or failing file system. Exit 1, like a registry that cannot be
# written; every other error about a path (missing, a directory, a name too long, no permission) is the path the user
# gave: exit 2.
_NOT_INPUT = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.ENOMEM}


def _os_error(e: OSError) -> int:
    """A file-system error that no command turned into a message of its own: one line naming the path (every path
    archspec touches comes from the user's arguments, a spec, or the state directories it names)."""
    where = next((str(f) for f in (e.filename, e.filename2) if f is not None), None)
    what = e.strerror or type(e).__name__
    click.echo(f"error: {printable(where, 200) + ': ' if where else ''}{printable(what)}", err=True)
    return 1 if e.errno in _NOT_INPUT else 2


def _stopped(signum: int) -> int:
    stop = Terminated(f"received {signal.Signals(signum).name}", signum)
    click.echo("interrupted" if stop.is_interrupt else f"terminated ({stop})", err=True)
    return stop.exit_code


def entry() -> None:
    sys.exit(main())  # the console script enters through archspec.entry, which imports this module


if __name__ == "__main__":
    entry()
