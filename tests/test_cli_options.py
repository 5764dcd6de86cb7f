"""The command line as a whole: every option documented, shared options spelled one way everywhere."""

from __future__ import annotations

import click
import pytest

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


@pytest.mark.parametrize("value", ["1,,2", "1,", ",1", " , ", "1_000", "\u0661", "+", "0x1", "1" * 19, "1,a"])
def test_integer_lists_refuse_empty_items_and_non_integers(value):
    """--seeds 1,,2 was read as 1,2 (issue 42): every item of --seeds/--distances is an ASCII integer, none empty."""
    import click

    from archspec.cli.options import int_list

    with pytest.raises(click.BadParameter, match="expected comma-separated integers"):
        int_list(value)
    assert int_list(" 0, 1,2 ") == [0, 1, 2] and int_list("-3") == [-3]


def test_ablate_seeds_with_an_empty_item_exits_2(tmp_path, capsys):
    from archspec.cli import main

    assert main(["ablate", str(tmp_path / "none.yaml"), "--seeds", "1,,2"]) == 2
    assert "an empty item is not one" in capsys.readouterr().err
