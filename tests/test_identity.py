"""A model's identity apart from its recipe: the generated code and the `specs` row depend on `model:` alone, and
`specs list` / `runs list` each show their own FLOPs (the spec's at context_length, the run's at its seq_len)."""

from __future__ import annotations

import json

import yaml

from archspec.cli import main
from archspec.kinds.base import identity_dump
from archspec.registry import Registry
from archspec.spec import load_spec_dict, model_json, model_hash
from archspec.train.logger import learning_recipe, recipe_hash, run_key
from tests.tiny import tiny_model

MODEL = tiny_model(vocab_size=320, context_length=64)  # the rows below are priced at context_length 64


def run(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_two_train_sections_build_byte_identical_code_and_one_specs_row(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    spec_file, out = tmp_path / "s.yaml", tmp_path / "gen"
    texts = []
    for train in ({"lr": 1e-3, "steps": 10, "warmup_steps": 1}, {"lr": 3e-4, "steps": 500, "seq_len": 16, "compile": "none"}):
        spec_file.write_text(yaml.safe_dump({"name": "same", "model": MODEL, "train": train}))
        rc, _, err = run(capsys, "build", str(spec_file), "--out", str(out), "--registry", url, "--json")
        assert rc == 0, err
        texts.append((out / "same.py").read_bytes())
    assert texts[0] == texts[1]
    rc, listed, _ = run(capsys, "specs", "list", "--registry", url, "--format", "json")
    (row,) = json.loads(listed)
    assert row["names"] == "same" and row["flops.seq_len"] == 64

    # Another name, same model: a file of its own whose code below the banner is identical, and still one row.
    spec_file.write_text(yaml.safe_dump({"name": "other", "model": MODEL}))
    assert run(capsys, "build", str(spec_file), "--out", str(out), "--registry", url, "--json")[0] == 0
    body = lambda text: text.split(b'"""', 2)[2]  # noqa: E731 - after the banner and the docstring naming the spec
    assert body((out / "other.py").read_bytes()) == body(texts[0])
    rc, listed, _ = run(capsys, "specs", "list", "--registry", url, "--format", "json")
    (row,) = json.loads(listed)
    assert row["names"] == "same, other"


def test_spec_json_and_hash_are_the_model_alone():
    a = load_spec_dict({"name": "a", "model": MODEL, "train": {"lr": 1e-3}})
    b = load_spec_dict({"name": "b", "model": MODEL, "train": {"lr": 5e-3, "steps": 3, "warmup_steps": 0}})
    c = load_spec_dict({"name": "a", "model": {**MODEL, "d_model": 64}})
    assert model_hash(a) == model_hash(b) != model_hash(c)
    # the model section as the identity dumps it (fields added later at their default left out: archspec.kinds.base.Since)
    assert json.loads(model_json(a)) == identity_dump(a.model) and "lr" not in model_json(a)


def test_the_run_key_covers_what_is_learned_and_nothing_else():
    spec = load_spec_dict({"name": "a", "model": MODEL})
    recipe = spec.train.model_dump(mode="json")
    key = run_key(model_hash(spec), recipe, "data", 0)
    for observed in ({"compile": "none"}, {"compile": "whole"}, {"eval_interval": 7}, {"eval_batches": 9}, {"eval_tokens": 999},
                     {"checkpoint_interval": 3}, {"world_size": 1}, {"log_to": ["tensorboard", "mlflow"]}):
        assert run_key(model_hash(spec), {**recipe, **observed}, "data", 0) == key, observed
    for learned in ({"lr": 1.0}, {"steps": 3}, {"batch_size": 3}, {"seq_len": 8}, {"grad_accum": 2},
                    {"precision": "bf16"}, {"world_size": 2}, {"warmup_steps": 0}, {"weight_decay": 0.0},
                    {"data": {**recipe["data"], "val_fraction": 0.1}}):
        assert run_key(model_hash(spec), {**recipe, **learned}, "data", 0) != key, learned
    assert run_key(model_hash(spec), recipe, "data2", 0) != key != run_key(model_hash(spec), recipe, "data", 1)
    assert "seed" not in learning_recipe(recipe) and recipe_hash(recipe) == recipe_hash({**recipe, "seed": 5})


def test_specs_list_and_runs_list_each_show_their_own_flops_without_flip_flop(tmp_path, capsys):
    from tests.registry.helpers import accounting, make_info, record_run

    url = f"sqlite:///{tmp_path / 'reg.db'}"
    short = load_spec_dict({"name": "short", "model": MODEL, "train": {"seq_len": 16}})
    reg = Registry(url)

    def flops() -> tuple[dict, dict]:
        (s,) = reg.specs()
        _, runs, _ = run(capsys, "runs", "list", "--registry", url, "--format", "json")
        assert {r["id"]: r["flops.seq_len"] for r in json.loads(runs)} == {r.id: 16 for r in reg.runs()}
        return s.accounting, {r.id: r.accounting for r in reg.runs()}

    from archspec.accounting import account

    reg.record_spec(short, None, account(short).to_dict())  # a build: context_length 64
    info = make_info(short)
    record_run(reg, info, {"loss": [(0, 1.0)]})  # a run: seq_len 16
    at_ctx, at_run = account(short).to_dict(), accounting(short)
    assert at_ctx["flops_per_token"] != at_run["flops_per_token"]
    for seed in (1, 2):  # build again, run again: nothing flips
        spec_acct, run_accts = flops()
        assert spec_acct == {**at_ctx, "seq_len": 64} and run_accts[info.run_id] == {**at_run, "seq_len": 16}
        reg.record_spec(short, None, account(short).to_dict())
        record_run(reg, make_info(short, seed=seed), {"loss": [(0, 1.0)]})
    # Filters: flops.* is the spec's in specs list, the run's in runs list; flops.seq_len is shown.
    f_ctx, f_run = at_ctx["flops_per_token"]["forward"], at_run["flops_per_token"]["forward"]
    assert len(reg.specs(where=f"flops.forward = {f_ctx} and flops.seq_len = 64")) == 1
    assert len(reg.runs(where=f"flops.forward = {f_run} and flops.seq_len = 16")) == 3
    assert reg.runs(where=f"flops.forward = {f_ctx}") == [] and reg.specs(where=f"flops.forward = {f_run}") == []
    rc, table, _ = run(capsys, "specs", "list", "--registry", url)
    assert rc == 0 and "flops.seq_len" in table.splitlines()[0] and "short" in table
    rc, table, _ = run(capsys, "runs", "list", "--registry", url, "--columns", "flops.forward,flops.seq_len")
    assert rc == 0 and "flops.seq_len" in table.splitlines()[0]
    reg.close()
