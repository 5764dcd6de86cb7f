"""Sweep files: expansion, budgets, validation of every variant before training, shards."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.ablate.sweep import load_sweep, parse_shard, spec_diff
from archspec.errors import UserError

BASE = {"name": "b", "model": {"vocab_size": 300, "context_length": 32, "d_model": 32, "n_layers": 1,
                               "attention": {"n_heads": 4}},
        "train": {"batch_size": 2, "seq_len": 16, "steps": 7, "warmup_steps": 2}}


def sweep(**kw):
    data = {"name": "s", "base": BASE, "seeds": [0, 1], **kw}
    return load_sweep(data=data)


def test_grid_is_cartesian_and_zip_varies_together():
    s = sweep(grid={"model.norm.kind": ["layernorm", "rmsnorm"], "model.ffn": [{"kind": "mlp"}, {"kind": "glu"}]},
              zip={"model.d_model": [32, 64], "model.attention.n_heads": [2, 4]})
    assert len(s.variants) == 2 * 2 * 2
    assert len(s.jobs) == 8 * 2
    combos = {(v.spec.model.norm.kind, v.spec.model.ffn.kind, v.spec.model.d_model, v.spec.model.attention.n_heads)
              for v in s.variants}
    assert len(combos) == 8
    assert {(c[2], c[3]) for c in combos} == {(32, 2), (64, 4)}  # zipped keys never cross
    assert {j.spec.train.seed for j in s.jobs} == {0, 1}


def test_whole_sub_specs_as_values_and_diff():
    s = sweep(grid={"model.ffn": [{"kind": "mlp", "activation": "gelu", "hidden_dim": 128},
                                  {"kind": "glu", "activation": "silu", "hidden_dim": 88}]})
    a, b = s.variants
    assert a.spec.model.ffn.kind == "mlp" and b.spec.model.ffn.hidden_dim == 88
    diff = spec_diff(a.spec, b.spec)
    assert diff["model.ffn.kind"] == ("mlp", "glu") and "name" not in diff and "train.seed" not in diff


@pytest.mark.parametrize("budget,steps", [({"steps": 5}, [5, 5]), ({"tokens": 1000}, [math.ceil(1000 / 32)] * 2)])
def test_budget_steps_and_tokens(budget, steps):
    s = sweep(budget=budget, grid={"model.n_layers": [1, 2]})
    assert [v.spec.train.steps for v in s.variants] == steps
    assert all(v.spec.train.warmup_steps <= v.spec.train.steps for v in s.variants)


def test_flops_budget_gives_bigger_models_fewer_steps():
    s = sweep(budget={"flops": 2e9}, grid={"model.n_layers": [1, 4]})
    small, big = s.variants
    assert big.spec.train.steps < small.spec.train.steps
    for v in s.variants:
        per_step = v.accounting.flops_train * 32
        assert (v.spec.train.steps - 1) * per_step < 2e9 <= v.spec.train.steps * per_step


def test_every_invalid_variant_listed_before_anything_trains():
    with pytest.raises(UserError) as exc:
        sweep(grid={"model.attention.n_kv_heads": [1, 3, 4, 5]})
    assert len(exc.value.problems) == 2
    assert exc.value.problems[0].startswith("variant 1 (model.attention.n_kv_heads=3): model.attention.n_kv_heads")
    assert exc.value.problems[1].startswith("variant 3 (model.attention.n_kv_heads=5)")


@pytest.mark.parametrize("bad,needle", [
    ({"budget": {"tokens": 5, "steps": 3}}, "exactly one of tokens, steps, flops"),
    ({"zip": {"model.d_model": [32, 64], "model.n_layers": [1]}}, "same number of values"),
    ({"baseline": 3}, "baseline: index 3"),
    ({"seeds": [1, 1]}, "repeated seed"),
    ({"grid": {"model.d_model": []}}, "needs at least one value"),
    ({"name": "Bad Name"}, "name"),
    ({"grids": {}}, "grids: unknown field"),
])
def test_bad_sweep_files(bad, needle):
    with pytest.raises(UserError) as exc:
        sweep(**bad)
    assert needle in exc.value.render()


def test_base_path_relative_to_sweep_file(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "specs" / "ablations").mkdir()
    f = tmp_path / "specs" / "ablations" / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "base": "../base.yaml", "grid": {"model.n_layers": [1, 2]}}))
    assert len(load_sweep(f).variants) == 2
    f.write_text(yaml.safe_dump({"name": "s", "base": "../missing.yaml"}))
    with pytest.raises(UserError) as exc:
        load_sweep(f)
    assert "missing.yaml: no such base spec file" in exc.value.render()


def test_every_sweep_problem_at_once_each_once(tmp_path):
    """Four mistakes of different layers (a field, a rule across fields, the baseline, the base spec shared by every
    variant) in one round; the base's problem once, not once per variant."""
    bad_base = {**BASE, "model": {**BASE["model"], "d_model": 30}}  # 30 is not divisible by the 4 heads
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "base": bad_base, "seeds": [1, 1], "budget": {"tokens": 0},
                                 "grid": {"model.n_layers": [1, 2, 3]}, "baseline": 5}))
    with pytest.raises(UserError) as exc:
        load_sweep(f)
    problems = exc.value.problems
    assert any(p.startswith("budget.tokens:") for p in problems), problems
    assert "seeds: repeated seed in [1, 1]" in problems
    assert "baseline: index 5 but the sweep has 3 variants" in problems
    shared = [p for p in problems if "model.attention.n_heads" in p]
    assert len(shared) == 1 and shared[0].startswith("every variant: "), problems
    assert len(problems) == len(set(problems)) == 4


@settings(max_examples=40, deadline=None)
@given(n_layers=st.lists(st.integers(1, 3), min_size=1, max_size=3, unique=True),
       seeds=st.lists(st.integers(0, 99), min_size=1, max_size=4, unique=True), shards=st.integers(1, 7))
def test_shards_partition_the_jobs_exactly(n_layers, seeds, shards):
    s = load_sweep(data={"name": "s", "base": BASE, "seeds": seeds, "grid": {"model.n_layers": n_layers}})
    parts = [s.shard(i, shards) for i in range(shards)]
    keys = [j.key for part in parts for j in part]
    assert sorted(keys) == sorted(j.key for j in s.jobs) and len(keys) == len(set(keys))
    # deterministic: loading again gives the same split
    again = load_sweep(data={"name": "s", "base": BASE, "seeds": seeds, "grid": {"model.n_layers": n_layers}})
    assert [[j.key for j in again.shard(i, shards)] for i in range(shards)] == [[j.key for j in p] for p in parts]


@pytest.mark.parametrize("text", ["1", "a/b", "2/2", "-1/3", "0/0"])
def test_bad_shard_argument(text):
    with pytest.raises(UserError, match="--shard"):
        parse_shard(text)


def test_command_line_overrides_seeds_and_steps(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "base": BASE, "seeds": [0], "budget": {"tokens": 10_000},
                                 "grid": {"model.n_layers": [1, 2]}}))
    s = load_sweep(f, overrides=["train.lr=0.01", "model.n_layers=3"], seeds=[4, 5], steps=3)
    assert [j.seed for j in s.jobs] == [4, 5, 4, 5]
    assert all(v.spec.train.steps == 3 and v.spec.train.lr == 0.01 for v in s.variants)
    assert [v.spec.model.n_layers for v in s.variants] == [1, 2]  # the grid wins over --set
    with pytest.raises(UserError) as exc:
        load_sweep(f, overrides=["model.d_model=30"])
    assert str(exc.value).startswith(f"{f}: every variant: model.attention.n_heads")


def test_sweep_schema_accepts_the_presets_and_refuses_wrong_sweeps(capsys):
    import json
    from pathlib import Path

    import jsonschema

    from archspec.cli import main

    assert main(["schema", "--sweep"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    presets = sorted((Path(__file__).resolve().parents[2] / "specs" / "ablations").glob("*.yaml"))
    assert len(presets) >= 4
    for path in presets:
        data = yaml.safe_load(path.read_text())
        assert not list(validator.iter_errors(data)), path
        load_sweep(path)  # and archspec agrees
    good = {"name": "s", "base": BASE, "seeds": [0, 1], "budget": {"steps": 5}, "grid": {"model.n_layers": [1, 2]}}
    assert validator.is_valid(good)
    for wrong in ({**good, "budget": {"steps": 5, "tokens": 100}}, {**good, "budget": {}}, {**good, "grdi": {}},
                  {**good, "grid": {"model.n_layers": []}}, {**good, "seeds": [1, 1]}, {**good, "name": "Bad Name"},
                  {k: v for k, v in good.items() if k != "base"}, {**good, "grid": {"model..x": [1]}}):
        assert not validator.is_valid(wrong), wrong
        with pytest.raises(UserError):  # archspec refuses each of them too
            load_sweep(data=wrong)
