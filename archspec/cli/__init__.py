"""The `archspec` command line. Every bad input ends in exit code 2 with a message, never a traceback."""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
import warnings
from collections.abc import MutableMapping

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


# One module of archspec/cli per command family; each defines its click commands as `<name>_cmd` and calls into the
# package that does the work (build → codegen, train → train, runs/specs/registry → registry, ...). A module is
# imported only when one of its commands runs (or its own --help is asked for): `archspec --version`, `--help` and
# the registry's commands never import torch. Each command's one-line help is written here too, for `archspec --help`
# without importing anything (tests/test_startup.py keeps it equal to the command's docstring; a command missing
# here still works, and `archspec --help` then imports its module for the line).
_SUBCOMMANDS = [
    ("archspec.cli.build", ["build", "check", "schema"]),
    ("archspec.cli.train", ["train", "peak"]),
    ("archspec.cli.registry", ["runs", "specs", "registry", "gc"]),
    ("archspec.cli.ablate", ["ablate", "report"]),
    ("archspec.cli.hf", ["import-hf", "export-hf"]),
    ("archspec.cli.sample", ["sample"]),
    ("archspec.cli.probe", ["probe"]),
    ("archspec.cli.scaling", ["scaling"]),
    ("archspec.cli.quant", ["quantize"]),
    ("archspec.cli.mup", ["mup-check"]),
    ("archspec.cli.ui", ["ui"]),
]

# The first paragraph of each command's docstring, as `archspec --help` shortens it.
SHORT_HELP = {
    "build": "Validate SPEC, generate its module, run one forward on a tiny batch, print its accounting.",
    "check": "Regenerate every spec in specs/ in memory and diff against generated/; exit 1 when out of sync.",
    "schema": "Print the JSON Schema of a spec file, or of a sweep file with --sweep (for editor completion and "
              "validation).",
    "train": "Train SPEC once with the shared loop and record the run.",
    "peak": "Show (or --measure) the FLOP/s ceiling that MFU is a fraction of.",
    "runs": "Query the runs in the registry.",
    "specs": "Query the specs recorded by `archspec build` (with their accounting), trained or not.",
    "registry": "The registry database itself: its schema revision, and upgrading it.",
    "gc": "Free the checkpoints of FINISHED runs that a policy lets go (dry run unless --apply). Never touches a "
          "RUNNING run, or a file that is not recorded as a run's checkpoint.",
    "ablate": "Train every variant × seed of SWEEP (skipping finished runs), then report what mattered.",
    "report": "Rebuild a sweep's report (table, PNG, HTML) from the registry alone. SWEEP: a sweep file or a sweep "
              "name.",
    "import-hf": "Spec (and weights) from a transformers config.json or model directory.",
    "export-hf": "A transformers model directory (config.json, model.safetensors, tokenizer) from a run or a "
                 "checkpoint.",
    "sample": "Generate text from a run (its id, run directory or checkpoint), a weights checkpoint (import-hf), or a "
              "bare SPEC with random weights.",
    "probe": "Evaluate a trained run on a capability task without training it: exact-match accuracy on the answer "
             "positions (passkey: also per distance). Parameters default to the run's own task when it trained on "
             "this one. The result is recorded as an evaluation of the run (the run's own record is not changed): "
             "`archspec runs list --where \"probe.accuracy > 0.5\"`, `archspec runs show RUN`.",
    "scaling": "Fit L = E + A·x^(−α) over the finished runs of SWEEP (a sweep file or name), or those --where "
               "selects.",
    "quantize": "Quantize a run's weights to int8 or int4 (weight-only), write the quantized checkpoint beside the "
                "run's own (with its digest) and record an evaluation of the run: bytes before and after, validation "
                "loss before and after on the run's own validation set.",
    "mup-check": "µP's coordinate check: train SPEC a few steps at each width and show how activation scales grow "
                 "with width.",
    "ui": "Browse the registry: runs (filters as `runs list --where`), curves, a run's spec, accounting and generated "
          "code, runs side by side, and each sweep's report. Read-only: nothing is written to the registry.",
}


class _LazyCommands(MutableMapping):
    """A group's commands by name, each module imported on first use. Iterating (names, `sorted`, click's "did you
    mean") imports nothing; reading a command (`[name]`, `.get`, `.items()`, `.values()`) imports its module."""

    def __init__(self, modules: dict[str, str]):
        self._modules = modules  # name -> module not yet imported
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            module = importlib.import_module(self._modules[name])  # KeyError: no such command
            self._loaded[name] = getattr(module, name.replace("-", "_") + "_cmd")
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._modules.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self):
        return iter(dict.fromkeys([*self._modules, *self._loaded]))

    def __len__(self) -> int:
        return len(set(self._modules) | set(self._loaded))

    def loaded(self, name: str) -> click.Command | None:
        return self._loaded.get(name)


class LazyGroup(click.Group):
    """click's group whose commands are imported when they run (click's "lazily loading subcommands" pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click's, with each command's line from SHORT_HELP unless the command is already imported."""
        rows = []
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        for name in names:
            command = self.commands.loaded(name) if isinstance(self.commands, _LazyCommands) else None
            if command is None and name in SHORT_HELP:
                rows.append((name, click.utils.make_default_short_help(SHORT_HELP[name], limit)))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="archspec")
def cli() -> None:
    """Compile decoder-only transformer specs into PyTorch modules, train them, and query the runs."""


cli.commands = _LazyCommands({name: module for module, names in _SUBCOMMANDS for name in names})


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


# click >= 8.2 raises this for a group called without its subcommand (click 8.1 printed the help and exited 0).
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


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
    except _NO_ARGS_IS_HELP as e:
        # A group without its subcommand (`archspec`, `archspec runs`): click's help text, all of it ours, shown as
        # click shows it (on stderr, exit code 2), line breaks kept.
        e.show()
        return e.exit_code
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
