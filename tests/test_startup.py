"""Start-up (issue 33): the commands that do not train, sample or build a model never import torch, and a command's
module is imported only when that command runs. Each case is a new interpreter, since this one has torch loaded
already. No timing is asserted here (bench/bench_startup.py measures it)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys
from archspec.cli import main
rc = main(json.loads(sys.argv[1]))
sys.stdout.flush()
print("\\n" + json.dumps({"rc": rc, "modules": sorted(m for m in sys.modules if m.split(".")[0] in
      ("torch", "archspec", "alembic", "transformers", "numpy"))}), file=sys.stderr)
"""


def _run(argv: list[str], tmp_path: Path) -> tuple[int, list[str], str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ARCHSPEC_REGISTRY": f"sqlite:///{tmp_path}/default.db"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argv)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    head, _, last = proc.stderr.rstrip().rpartition("\n")
    report = json.loads(last)
    return report["rc"], report["modules"], proc.stdout, head


NO_TORCH = [
    ["--version"],
    ["--help"],
    ["-h"],
    ["runs", "list"],
    ["runs", "list", "--format", "json"],
    ["runs", "--help"],
    ["runs", "show", "--help"],
    ["specs", "list"],
    ["specs", "--help"],
    ["registry", "status"],
    ["registry", "--help"],
    ["schema"],
    ["schema", "--sweep"],
    ["ui", "--check"],
    *[[name, "--help"] for name in ("build", "check", "train", "peak", "ablate", "report", "import-hf", "export-hf",
                                    "sample", "probe", "scaling", "ui")],
    ["no-such-command"],
]


@pytest.mark.parametrize("argv", NO_TORCH, ids=" ".join)
def test_command_does_not_import_torch(argv, tmp_path):
    rc, modules, out, err = _run(argv, tmp_path)
    assert rc == (2 if argv == ["no-such-command"] else 0), err
    assert "torch" not in modules, f"archspec {' '.join(argv)} imported torch"


def test_version_and_top_help_import_no_command_module(tmp_path):
    for argv in (["--version"], ["--help"]):
        rc, modules, out, _ = _run(argv, tmp_path)
        assert rc == 0
        assert not [m for m in modules if m.startswith("archspec.cli.")], modules
        assert "alembic" not in modules and "archspec.registry" not in modules


def test_runs_list_on_a_missing_registry_reads_no_alembic_or_units(tmp_path):
    rc, modules, out, _ = _run(["runs", "list", "--registry", f"sqlite:///{tmp_path}/empty.db"], tmp_path)
    assert rc == 0 and out.lower().startswith("no runs in")
    assert "alembic" not in modules
    assert not [m for m in modules if m.startswith(("archspec.data", "archspec.kinds", "archspec.spec"))], modules


@pytest.mark.parametrize("group", [[], ["runs"], ["specs"], ["registry"]], ids=lambda g: " ".join(g) or "archspec")
def test_a_group_without_its_subcommand_prints_its_help_on_lines(group, tmp_path):
    """As click (>= 8.2) does: the group's help on stderr, exit code 2; line breaks kept, never a literal `\\n`."""
    rc, modules, out, err = _run(group, tmp_path)
    assert rc == 2
    assert "\\n" not in err
    lines = err.splitlines()
    assert lines[0].startswith(f"Usage: archspec {' '.join(group)}".replace("  ", " ")), err
    assert "Commands:" in lines and len(lines) > 6
    assert "torch" not in modules


def test_top_help_lists_every_command_as_its_module_would(tmp_path):
    """`archspec --help` takes each line from archspec.cli.SHORT_HELP without importing the commands: the same text
    as click makes from the command's docstring (a new command's line is added there)."""
    from archspec.cli import SHORT_HELP, cli

    names = list(cli.commands)
    assert sorted(SHORT_HELP) == sorted(names), "archspec.cli.SHORT_HELP and _SUBCOMMANDS disagree"
    for name in names:
        command = cli.commands[name]
        first = inspect.cleandoc(command.help or "").split("\n\n")[0]
        assert " ".join(first.split()) == SHORT_HELP[name], f"SHORT_HELP[{name!r}] differs from its docstring"
    lazy = _run(["--help"], tmp_path)[2]
    ctx = click.Context(click.Group("archspec"), info_name="archspec")
    formatter = ctx.make_formatter()
    click.Group.format_commands(click.Group("archspec", commands=dict(cli.commands.items())), ctx, formatter)
    assert formatter.getvalue() in lazy


def test_commands_still_load_on_use():
    from archspec.cli import cli

    commands = dict(cli.commands.items())
    assert {"build", "train", "runs", "specs", "registry", "ablate", "ui"} <= set(commands)
    assert all(isinstance(c, click.Command) for c in commands.values())


def test_revisions_read_without_alembic_are_alembics(tmp_path):
    """archspec.registry.migrate reads the revision chain from the migration files and the stored revision with
    plain SQL (no alembic import for a read); both agree with alembic's own answers."""
    from alembic.runtime.migration import MigrationContext
    from alembic.util import CommandError
    from sqlalchemy import create_engine, text

    from archspec.registry import migrate

    assert migrate._chain() == migrate._alembic_chain()
    engine = create_engine(f"sqlite:///{tmp_path}/r.db")

    def both(conn):
        ctx = MigrationContext.configure(conn, opts={"version_table": migrate.VERSION_TABLE})
        return migrate.current_revision(conn), ctx.get_current_revision()

    with engine.begin() as conn:
        assert both(conn) == (None, None)  # no version table
        conn.execute(text(f"CREATE TABLE {migrate.VERSION_TABLE} (version_num VARCHAR(32) NOT NULL)"))
        assert both(conn) == (None, None)  # an empty one
        conn.execute(text(f"INSERT INTO {migrate.VERSION_TABLE} VALUES ('0004')"))
        assert both(conn) == ("0004", "0004")
        conn.execute(text(f"INSERT INTO {migrate.VERSION_TABLE} VALUES ('0003')"))
        with pytest.raises(CommandError):
            migrate.current_revision(conn)
    engine.dispose()


def test_runs_list_on_an_empty_registry_at_head_reads_no_alembic(tmp_path):
    url = f"sqlite:///{tmp_path}/head.db"
    assert _run(["registry", "upgrade", "--registry", url], tmp_path)[0] == 0
    for argv in (["runs", "list"], ["specs", "list"], ["registry", "status"]):
        rc, modules, out, err = _run([*argv, "--registry", url], tmp_path)
        assert rc == 0, err
        assert "alembic" not in modules and "torch" not in modules, argv
