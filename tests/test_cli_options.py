"""The command line as a whole: every option documented, shared options spelled one way everywhere."""

from __future__ import annotations

import click

from archspec.cli import cli


def _commands(group: click.Group, prefix: str = ""):
    for name, cmd in group.commands.items():
        yield f"{prefix}{name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{prefix}{name} ")


def test_every_option_has_help():
    missing = [f"archspec {name} {opt.opts[0]}" for name, cmd in _commands(cli) for opt in cmd.params
               if isinstance(opt, click.Option) and not (opt.help or "").strip()]
    assert not missing, missing


def test_shared_options_are_spelled_one_way():
    seen: dict[str, set[tuple]] = {}
    for name, cmd in _commands(cli):
        for opt in cmd.params:
            if isinstance(opt, click.Option) and opt.opts[0] in ("--set", "--registry", "--device"):
                seen.setdefault(opt.opts[0], set()).add((opt.name, opt.metavar, opt.help))
    assert set(seen) == {"--set", "--registry", "--device"}
    assert all(len(v) == 1 for v in seen.values()), seen
    with_set = {name for name, cmd in _commands(cli) for opt in cmd.params if getattr(opt, "opts", [""])[0] == "--set"}
    assert {"build", "train", "ablate"} <= with_set


def test_python_dash_m_archspec_is_the_command():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "archspec", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("Usage: archspec "), out.stderr[-2000:]
