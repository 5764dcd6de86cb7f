"""Nothing a user or a sweep file gives reaches a generated script as code (archspec.launch.shell): every launcher
value (partition, account, qos, --sbatch options, the job folder, the torchrun line's words), from the command line
or from a sweep file's `launcher:` section, is refused (exit 2, one line) or arrives as the one word it was.

The property runs the generated sbatch script itself under bash, with stub srun/scontrol/torchrun on PATH, and
checks that no hostile value ran a command (a marker file) and that every accepted value arrived whole."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from archspec.errors import UserError

STUB_SBATCH = """#!/bin/sh
n=$(ls "{record}" | wc -l)
cp "$1" "{record}/script-$n.sh"
echo "Submitted batch job 1234"
"""
RECORD_ARGS = '#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a" >> "{log}"; done\nexit 0\n'


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    bin_dir, record = root / "bin", root / "record"
    bin_dir.mkdir()
    record.mkdir()
    _exe(bin_dir / "sbatch", STUB_SBATCH.format(record=record))
    _exe(bin_dir / "srun", "#!/bin/sh\nexit 0\n")
    _exe(bin_dir / "scontrol", "#!/bin/sh\necho node1\n")
    _exe(bin_dir / "torchrun", RECORD_ARGS.format(log=root / "torchrun-args"))
    with pytest.MonkeyPatch.context() as mp:  # the stub sbatch is the one submitit (and check_launcher) finds
        mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        yield root, bin_dir, record


def _marker_payloads(marker: Path) -> list[str]:
    m = str(marker)
    return [f"gpu\ntouch {m}", f"gpu\ntouch {m} #", f"$(touch {m})", f"`touch {m}`", f"'; touch {m}; '",
            f'"; touch {m}; "', f"gpu\rtouch {m}", f"gpu\x00touch {m}", f"gpu;touch {m}", f"gpu && touch {m}",
            f"gpu | touch {m}", f"gpu\u2028touch {m}", f"gpu\u202etouch {m}", f"gpu\x1b[2Jtouch {m}",
            f"gpu\ttouch {m}", f"gpu touch {m}", f"'\ntouch {m}\n'", f"\\\ntouch {m}"]


HOSTILE = st.one_of(
    st.text(max_size=40),
    st.text(st.sampled_from("ab\n\r\x00'\"`$();&| \\\u202e\u2028{}#*?~"), min_size=1, max_size=20),
    st.integers(0, 17),  # index into the marker payloads
)
FIELDS = ("partition", "account", "qos", "sbatch", "folder", "set")


def _run_script(script: Path, bin_dir: Path, cwd: Path) -> None:
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7",
           "HOME": str(cwd)}
    done = subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, timeout=30)
    if "ARCHSPEC_TORCHRUN" in script.read_text():  # what each node's task then runs (run_torchrun)
        line = subprocess.run(["bash", "-c", f". {script} >/dev/null 2>&1; printf %s \"$ARCHSPEC_TORCHRUN\""],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=30).stdout
        subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, timeout=30)
    return done


def _submit(field: str, value: str, workdir: Path) -> Path | None:
    """Submit one job with `value` in `field` through the path the CLI and a sweep file take; the script written,
    None when refused (the refusal must be one line)."""
    from archspec.launch.base import Payload, Resources
    from archspec.launch.choose import check_launcher
    from archspec.launch.options import settings_from
    from archspec.launch.settings import LauncherSettings
    from archspec.launch.slurm import SubmititLauncher, torchrun_setup
    from archspec.launch.train import train_args

    section = {"kind": "slurm", "folder": str(workdir / "jobs")}
    params = {}
    if field in ("partition", "account", "qos"):
        params[field] = value  # the command line's option
    elif field == "sbatch":
        section["sbatch"] = [f"--comment={value}"]  # the sweep file's section
    elif field == "folder":
        section["folder"] = str(workdir / value)
    try:
        settings = settings_from(params, LauncherSettings.model_validate(section))
        check_launcher(settings, "postgresql://u@h/db")
        launcher = SubmititLauncher(settings)
        if field == "set":
            p = launcher.parameters(Resources(nodes=2))
            p["setup"] = torchrun_setup(2, 1, train_args(str(workdir / "s.yaml"), [f"name={value}"], None,
                                                         "postgresql://u@h/db", False, "auto"))
            launcher.executor.update_parameters(**p)
            launcher.executor.submit(print, "x")
        else:
            launcher.submit([Payload(spec={}, run_id="r0", registry_url="postgresql://u@h/db")])
    except UserError as e:
        assert len(e.render().splitlines()) == 1 and "Traceback" not in e.render()
        assert "on PATH" not in str(e)  # refused for the value, not for want of a cluster
        return None
    except ValidationError as e:  # the sweep file's section: the sweep loader reports it as one line per field
        assert e.error_count() == 1
        return None
    return max(workdir.parent.joinpath("record").iterdir(), key=lambda p: p.stat().st_mtime_ns)


@given(field=st.sampled_from(FIELDS), raw=HOSTILE)
@example(field="partition", raw=0).via("a newline then a command")
@example(field="sbatch", raw=0).via("a newline in an sbatch option")
@example(field="folder", raw=1).via("a newline in the job folder")
@example(field="set", raw=3).via("backticks in a torchrun word")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_launcher_value_runs_as_code_in_the_generated_script(stubs, tmp_path_factory, field, raw):
    root, bin_dir, record = stubs
    workdir = root / f"w{len(list(root.iterdir()))}"
    workdir.mkdir()
    marker = workdir / "INJECTED"
    value = _marker_payloads(marker)[raw] if isinstance(raw, int) else raw
    for f in record.iterdir():
        f.unlink()
    script = _submit(field, value, workdir)
    if script is None:
        assert not any(record.iterdir())  # refused: nothing submitted
        return
    _run_script(script, bin_dir, workdir)
    assert not marker.exists(), (field, value, script.read_text())
    text = script.read_text()
    if field in ("partition", "account", "qos"):
        # a word: written as it is, or shell-quoted when the shell would read it otherwise ('[' is a glob)
        assert {f"#SBATCH --{field}={value}", f"#SBATCH --{field}={shlex.quote(value)}"} & set(text.splitlines())
    if field == "set":
        args = (root / "torchrun-args").read_text().splitlines()
        assert f"name={value}" in args
        (root / "torchrun-args").unlink()


@pytest.mark.parametrize("value", ["gpu\nrm -rf ~", "a b", "$(id)", "gpu;id", "\x00", "gpu\u202e", "x" * 2000, ""])
def test_every_slurm_name_is_one_word_from_the_cli_and_the_sweep_file(value):
    from archspec.launch.options import settings_from
    from archspec.launch.settings import LauncherSettings

    for key in ("partition", "account", "qos"):
        with pytest.raises(UserError, match=f"launcher option {key}"):
            settings_from({key: value, "launcher": "slurm"})
        with pytest.raises(ValidationError):
            LauncherSettings.model_validate({"kind": "slurm", key: value})


def test_a_sweep_files_launcher_section_with_a_newline_is_refused_by_field(tmp_path, capsys):
    import yaml

    from archspec.cli import main

    base = Path(__file__).resolve().parents[2] / "specs" / "llama-like.yaml"
    sweep = {"name": "s", "base": str(base), "seeds": [0], "grid": {"model.n_layers": [1]},
             "launcher": {"kind": "slurm", "sbatch": ["--comment=x\ntouch /tmp/pwned"]}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert main(["ablate", str(path), "--registry", f"sqlite:///{tmp_path / 'r.db'}", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "launcher.sbatch" in err and "control character" in err and len(err.splitlines()) == 1


def test_accepted_values_keep_their_meaning():
    from archspec.launch.shell import script_value
    from archspec.launch.slurm import sbatch_options

    assert script_value("gpu-a100,gpu", "--partition", word=True) == "gpu-a100,gpu"
    assert sbatch_options(["--constraint=a100&ib", "--exclusive", "--mail-type END,FAIL"]) == {
        "constraint": "a100&ib", "exclusive": True, "mail_type": "END,FAIL"}
    assert script_value("it's", "x", quote=True) == "'it'\"'\"'s'"
