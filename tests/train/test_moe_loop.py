"""The loop with an MoE model: router losses added and logged, router statistics recorded per eval and in the
summary, and filterable in the registry (`metrics.moe.max_load < 0.3`)."""

from __future__ import annotations

import json

import pytest
import torch

from archspec.cli import main
from archspec.registry import Registry
from archspec.train.logger import NullLogger
from archspec.kinds.ffn.moe import MoESpec
from archspec.train.loop import train

MOE = {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 32}, "aux_loss_coef": 0.05,
               "z_loss_coef": 0.001, "capacity_factor": 1.0}}


def test_router_metrics_summarise_each_layer_and_the_model():
    # each MoE layer's router row: [load of each expert..., dropped, entropy, padding]
    stats = {"layer0": torch.tensor([0.5, 0.25, 0.25, 0.0, 0.1, 1.0, 1.0]),
             "layer2": torch.tensor([0.3, 0.2, 0.3, 0.2, 0.3, 1.2, 1.5])}
    m = MoESpec.eval_metrics(stats)
    assert m["moe.layer0.max_load"] == 0.5 and m["moe.layer0.min_load"] == 0.0
    assert m["moe.layer2.max_load"] == pytest.approx(0.3) and m["moe.layer2.padding"] == 1.5
    assert m["moe.max_load"] == 0.5 and m["moe.min_load"] == 0.0
    assert m["moe.dropped"] == pytest.approx(0.2) and m["moe.entropy"] == pytest.approx(1.1)


def test_the_units_router_rows_are_the_models_router_stats(make_spec, tmp_path):
    from archspec.codegen import generate

    spec = make_spec({**MOE, "n_layers": 3, "layers": {"dense": {"select": [1], "ffn": {"kind": "glu", "hidden_dim": 32}}}})
    model = generate(spec, out_dir=tmp_path).Model()
    with torch.no_grad():
        model(torch.randint(0, spec.model.vocab_size, (2, 8)))
    rows, named = MoESpec.eval_stats(model), model.router_stats()
    assert list(rows) == ["layer0", "layer2"]  # only the MoE layers
    for layer, row in rows.items():
        parts = [named[f"{layer}.{k}"].reshape(-1) for k in ("load", "dropped", "entropy", "padding")]
        assert torch.equal(row, torch.cat(parts))


def test_moe_losses_are_added_and_router_stats_recorded(make_spec, tmp_path, cache):
    result = train(make_spec(MOE, steps=4, eval_interval=2), run_dir=tmp_path / "moe", cache=cache,
                   logger=(logger := NullLogger()))
    keys = {k for _, k, _ in logger.metrics}
    assert {"aux_moe_aux", "aux_moe_z"} <= keys
    aux = [v for _, k, v in logger.metrics if k == "aux_moe_aux"]
    assert len(aux) == 4 and all(0.05 * 0.99 <= a <= 0.05 * 4 for a in aux)  # α · n · Σ f_i P_i ∈ [α, α · n]
    for layer in (0, 1):
        for stat in ("max_load", "min_load", "dropped", "entropy", "padding"):
            assert [s for s, k, _ in logger.metrics if k == f"moe.layer{layer}.{stat}"] == [2, 4]
    s = logger.summary
    assert 0.25 <= s["moe.max_load"] <= 0.5 and 0 <= s["moe.min_load"] <= 0.25  # top-2 of 4: ≥ 1/4, ≤ 1/2
    assert 0 <= s["moe.dropped"] < 1 and 0 < s["moe.entropy"] <= torch.log(torch.tensor(4.0)).item() + 1e-6
    assert not any(k.startswith("moe.layer") for k in s)  # per-layer figures stay per-eval metrics
    assert result.metrics["moe.max_load"] == s["moe.max_load"]


def test_registry_filters_on_router_stats(tmp_path, capsys, corpus_dir):
    spec = tmp_path / "moe.yaml"
    spec.write_text(json.dumps({
        "name": "tiny-moe",
        "model": {"vocab_size": 320, "context_length": 32, "d_model": 32, "n_layers": 1,
                  "attention": {"n_heads": 2}, **MOE},
        "train": {"data": {"corpus": {"kind": "files", "paths": [str(corpus_dir)]}}, "batch_size": 2,
                  "warmup_steps": 1, "eval_interval": 2, "eval_tokens": 128}}))
    assert main(["train", str(spec), "--steps", "2", "--no-compile", "--json", "-q", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run")]) == 0
    result = json.loads(capsys.readouterr().out)
    max_load = result["moe.max_load"]
    registry = Registry(f"sqlite:///{tmp_path}/registry.db")
    assert [r.id for r in registry.runs(where=f"metrics.moe.max_load < {max_load + 1e-3}")] == [result["run_id"]]
    assert registry.runs(where=f"metrics.moe.max_load < {max_load - 1e-3}") == []
    assert [r.id for r in registry.runs(where=f"summary.moe.max_load >= {max_load - 1e-3}")] == [result["run_id"]]
    assert main(["runs", "list", "--where", "metrics.moe.max_load < 0.6"]) == 0
    assert "tiny-moe" in capsys.readouterr().out
