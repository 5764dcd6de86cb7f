"""The edges an afternoon of use finds, each by its class: printed commands run as printed, a run's artifacts go with
it, every spec-key typo gets the nearest valid key, exports are readable like files, the solved spec is written."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.cli import main
from archspec.console import program
from archspec.errors import UserError, closest_key
from archspec.spec import SpecError, load_spec_dict, model_hash
from archspec.spec.model import ModelSpec
from archspec.spec.train import TrainSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "specs" / "llama-like-tiny.yaml"


# ── every printed command runnable as printed ──

@pytest.mark.parametrize("argv0, want", [
    ("/opt/venv/bin/archspec", "/opt/venv/bin/archspec"),
    (".venv/bin/archspec", os.path.abspath(".venv/bin/archspec")),
    ("archspec", "archspec"),
    ("/x/archspec/__main__.py", f"{sys.executable} -m archspec"),
])
def test_the_program_is_named_as_it_was_invoked(monkeypatch, argv0, want):
    monkeypatch.setattr(sys, "argv", [argv0, "train"])
    assert program() == want


# ── spec-key typos: the nearest valid key at that place, by the filters' own function ──

SECTIONS = {"train": TrainSpec, "model": ModelSpec}


@settings(max_examples=60, deadline=None)
@given(section=st.sampled_from(sorted(SECTIONS)), data=st.data())
def test_every_spec_key_typo_gets_the_nearest_valid_key(section, data):
    fields = sorted(SECTIONS[section].model_fields)
    field = data.draw(st.sampled_from(fields))
    cut = data.draw(st.integers(0, len(field) - 1))
    typo = field[:cut] + field[cut + 1:]  # one letter dropped
    if not typo or typo in fields:
        return
    spec = yaml.safe_load(TINY.read_text())
    spec.setdefault(section, {})[typo] = 1
    with pytest.raises(SpecError) as e:
        load_spec_dict(spec)
    line = next(p for p in e.value.problems if p.startswith(f"{section}.{typo}:"))
    assert f"did you mean {closest_key(typo, set(fields))}?" in line


def _problem(spec: dict, path: str) -> str | None:
    """The text of the problem loading `spec` reports at `path` (after the path), None when it loads."""
    try:
        load_spec_dict(spec)
    except SpecError as e:
        return next((p.removeprefix(f"{path}:").strip() for p in e.problems if p.startswith(f"{path}:")), "(elsewhere)")
    return None


@settings(max_examples=80, deadline=None)
@given(component=st.sampled_from(["norm", "attention", "ffn", "mixer"]), data=st.data())
def test_a_layer_group_problem_reads_as_the_model_wide_one(component, data):
    """A field of a layer group's unit is validated against the same class as the model-wide field, so its problem
    reads the same: a typo gets the nearest valid key, a bad value says what was given. (The groups' errors used to be
    pydantic's bare text: `Extra inputs are not permitted`, no value.)"""
    from archspec.kinds import family

    members = family(component).members
    kind = data.draw(st.sampled_from(sorted(members)), label="kind")
    fields = sorted(f for f in members[kind].model_fields if f != "kind")
    if not fields:  # a kind with no field of its own (ffn: none) has nothing to misspell
        return
    field = data.draw(st.sampled_from(fields), label="field")
    if data.draw(st.booleans(), label="typo"):
        cut = data.draw(st.integers(0, len(field) - 1))
        key, value = field[:cut] + field[cut + 1:], 1
        if not key or key in fields:
            return
    else:
        key, value = field, data.draw(st.sampled_from([10**12, -7, "abc", True, 2.5, [1], {"x": 1}]), label="value")
    unit = {"kind": kind, key: value}
    base = {"name": "t", "model": {"vocab_size": 64, "context_length": 16, "d_model": 32, "n_layers": 2,
                                   "attention": {"n_heads": 4}}}
    wide = json.loads(json.dumps(base))
    wide["model"][component] = unit
    if component == "mixer":
        del wide["model"]["attention"]
    want = _problem(wide, f"model.{component}.{key}")
    if want is None or want == "(elsewhere)":
        return
    group = json.loads(json.dumps(base))
    group["model"]["layers"] = {"g": {"select": [0], component: unit}}
    assert _problem(group, f"model.layers.g.{component}.{key}") == want


def test_a_nested_typo_names_the_key_of_its_own_kind(capsys):
    assert main(["build", str(TINY), "--set", "model.ffn.hiden_dim=64", "--no-record"]) == 2
    err = capsys.readouterr().err
    assert "model.ffn.hiden_dim: unknown field; did you mean hidden_dim?" in err and "Traceback" not in err


# ── HF exports: readable like normal files, as the umask allows ──

@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_an_export_directory_has_the_modes_of_normal_files(tmp_path, umask):
    import torch

    from archspec.hf.io import write_model_dir

    old = os.umask(umask)
    try:
        write_model_dir(tmp_path / "out", {"model_type": "llama"}, {"w": torch.zeros(2, 2)}, {})
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f


# ── build --match writes the spec it solved ──

def test_build_match_writes_the_solved_spec(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["build", str(TINY), "--match", "params=400000", "--solve", "model.ffn.hidden_dim", "--no-record",
                 "--json", "--out", str(tmp_path / "gen")]) == 0
    out = json.loads(capsys.readouterr().out)
    solved = Path(out["matched"]["spec_file"])
    from archspec.spec import load_spec

    spec = load_spec(solved)
    assert model_hash(spec) == out["model_hash"] and spec.model.ffn.hidden_dim == out["matched"]["value"]


# ── a run's artifacts go with it: the TensorBoard directory too ──

def test_runs_delete_removes_the_runs_tensorboard_directory(tmp_path, capsys, monkeypatch):
    from archspec.registry import Registry
    from tests.registry.helpers import make_info, make_spec, record_run

    monkeypatch.setenv("ARCHSPEC_TENSORBOARD_DIR", str(tmp_path / "tb"))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with Registry(url) as reg:
        run_id = record_run(reg, make_info(make_spec("tiny")), status="FAILED")
        other = record_run(reg, make_info(make_spec("tiny"), seed=1), status="FAILED")
    for rid in (run_id, other):
        d = tmp_path / "tb" / f"tiny-{rid}"
        d.mkdir(parents=True)
        (d / "events.out.tfevents.1.host").write_bytes(b"x")
    assert main(["runs", "delete", run_id, "--yes", "--registry", url]) == 0, capsys.readouterr()
    assert not (tmp_path / "tb" / f"tiny-{run_id}").exists() and (tmp_path / "tb" / f"tiny-{other}").is_dir()
    (tmp_path / "tb" / f"tiny-{other}" / "mine.txt").write_text("keep")  # not the sink's: refused, nothing deleted
    assert main(["runs", "delete", other, "--yes", "--registry", url]) == 2
    assert "mine.txt" in capsys.readouterr().err and Registry(url).get_run(other)


# ── what archspec writes into a checkout is git-ignored ──

def test_outputs_in_the_working_directory_are_ignored():
    ignored = (ROOT / ".gitignore").read_text().split()
    for folder in ("runs/", "reports/", "builds/", "tensorboard/"):
        assert folder in ignored


def test_the_launchers_literal_job_folder_is_tidied(tmp_path):
    from archspec.launch.slurm import SubmititLauncher

    launcher = SubmititLauncher.__new__(SubmititLauncher)
    launcher.folder = tmp_path / "%j"
    launcher.folder.mkdir()
    launcher._tidy_folder()
    assert not launcher.folder.exists()
    launcher.folder.mkdir()
    (launcher.folder / "x").write_text("")
    launcher._tidy_folder()  # not empty: somebody's files, left
    assert launcher.folder.exists()


def test_closest_key_is_the_one_rule():
    from archspec.registry.query import fields

    assert fields.closest_key is closest_key
    assert closest_key("tok_s", {"tokens_per_s", "val_loss"}) == "tokens_per_s"
    with pytest.raises(UserError):
        raise UserError("x")


@pytest.mark.parametrize("key, value, want", [
    ("model.mixer", "short_conv", "model.mixer: expected a mapping, got 'short_conv'; write {kind: short_conv}"),
    ("train.optimizer", "muon", "train.optimizer: expected a mapping, got 'muon'; write {kind: muon}"),
    ("model.norm", 3, "model.norm: expected a mapping with a kind (kind must be one of 'layernorm', 'rmsnorm'), got 3"),
    ("train.optimizer", {"kind": "sgd"}, "train.optimizer: kind must be one of 'adamw', 'muon', got 'sgd'"),
])
def test_a_kind_given_in_the_wrong_shape_is_named(key, value, want):
    """`optimizer: muon` used to be answered `kind must be one of 'adamw', 'muon', got 'muon'`: the kind was right,
    the shape (a mapping with a kind) was not; every kind union answers through the one formatter."""
    spec = yaml.safe_load(TINY.read_text())
    section, field = key.split(".")
    spec[section][field] = value
    with pytest.raises(SpecError) as e:
        load_spec_dict(spec)
    assert want in e.value.problems, e.value.problems


@pytest.mark.parametrize("value", [7, "rope", [1], True])
def test_a_layer_groups_positional_that_is_not_a_mapping_is_refused(value):
    """A group's `attention.positional: 7` was dropped without a word (only its nested keys were read); it is refused
    at its path, as the same value model-wide is."""
    spec = {"name": "t", "model": {"vocab_size": 64, "context_length": 16, "d_model": 32, "n_layers": 2,
                                   "attention": {"n_heads": 4},
                                   "layers": {"g": {"select": [0], "attention": {"positional": value}}}}}
    problem = _problem(spec, "model.layers.g.attention.positional")
    assert problem not in (None, "(elsewhere)") and repr(value) in problem
