"""The learning-rate schedule and the weight-decay groups."""

from __future__ import annotations

import math

import pytest
import torch

from archspec import codegen
from archspec.spec.train import TrainSpec
from archspec.train.optim import build_optimizer, lr_at, param_groups


def test_warmup_is_linear_up_to_the_peak():
    r = TrainSpec(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    warm = [lr_at(s, r) for s in range(10)]
    assert warm == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])
    assert lr_at(10, r) == pytest.approx(1e-3)


def test_cosine_decays_monotonically_to_the_floor_at_the_last_step():
    r = TrainSpec(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    decay = [lr_at(s, r) for s in range(10, 100)]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    assert decay[-1] == pytest.approx(1e-4)
    midpoint = 10 + (100 - 1 - 10) / 2
    assert lr_at(int(midpoint), r) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * (int(midpoint) - 10) / 89)) * 9e-4)
    assert lr_at(10_000, r) == pytest.approx(1e-4)  # past the end: stays at the floor


def test_no_warmup_starts_at_the_peak_and_zero_floor_ends_at_zero():
    r = TrainSpec(steps=20, warmup_steps=0, lr=2e-3, min_lr_ratio=0.0)
    assert lr_at(0, r) == pytest.approx(2e-3) and lr_at(19, r) == pytest.approx(0.0)


def test_weight_decay_on_matrices_only(make_spec, tmp_path):
    spec = make_spec(model={"norm": {"kind": "layernorm"}, "attention": {"n_heads": 2, "bias": True},
                            "ffn": {"kind": "mlp", "bias": True}})
    model = codegen.generate(spec, out_dir=tmp_path).Model()
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "tok_emb.weight" in decayed and "blocks.0.attn.qkv_proj.weight" in decayed
    assert all(model.get_parameter(n).ndim >= 2 for n in decayed)
    assert all(model.get_parameter(n).ndim == 1 for n in kept)
    assert any("norm" in n for n in kept) and any(n.endswith(".bias") for n in kept)
    # every parameter exactly once, the tied embedding/head included
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert decayed | kept == set(dict(model.named_parameters()))


def test_optimizer_uses_the_recipe(make_spec, tmp_path):
    spec = make_spec(lr=1e-2, warmup_steps=4, beta1=0.8, beta2=0.9, weight_decay=0.05)
    model = codegen.generate(spec, out_dir=tmp_path).Model()
    opt = build_optimizer(model, spec.train, torch.device("cpu"))
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(2.5e-3)] * 2
    assert opt.param_groups[0]["betas"] == (0.8, 0.9) and opt.param_groups[0]["weight_decay"] == 0.05


def test_the_measured_ceiling_is_read_never_rewritten(tmp_path, monkeypatch):
    """The CPU ceiling is measured once (dated) and then only read; a bare number from an older release (which let
    runs raise it) is not trusted and is measured afresh."""
    import json

    import torch

    from archspec.train.throughput import _measurement_key, measure_ceiling, peak_flops, read_ceiling

    monkeypatch.setattr("archspec.train.throughput.machine_busy", lambda: False)  # a quiet machine stores it
    monkeypatch.setattr("archspec.train.throughput._REMEASURED", set())  # nothing measured earlier in this process
    cpu = torch.device("cpu")
    key = _measurement_key(cpu, torch.float32)
    (tmp_path / "peak_flops.json").write_text(json.dumps({key: 1e30}))  # old format, absurdly raised
    assert read_ceiling(cpu, torch.float32, tmp_path) is None
    flops, source = peak_flops(cpu, torch.float32, tmp_path)
    assert 1e8 < flops < 1e14 and source.startswith("this machine's measured matmul rate")
    entry = json.loads((tmp_path / "peak_flops.json").read_text())[key]
    assert entry["flops"] == flops and entry["measured_at"]
    before = (tmp_path / "peak_flops.json").read_bytes()
    assert peak_flops(cpu, torch.float32, tmp_path)[0] == flops  # read, not measured again
    assert (tmp_path / "peak_flops.json").read_bytes() == before
    assert measure_ceiling(cpu, torch.float32, tmp_path, repeats=2)["flops"] > 0  # only an explicit measure writes


def test_one_ceiling_per_machine_that_a_loaded_measurement_never_lowers(tmp_path, monkeypatch):
    import json

    import torch

    from archspec.train import throughput

    busy = [True]
    monkeypatch.setattr(throughput, "machine_busy", lambda: busy[0])
    monkeypatch.setattr(throughput, "_REMEASURED", set())
    rates = iter([50e9, 80e9, 30e9, 90e9])  # what each measurement would find
    calls = []
    monkeypatch.setattr(throughput, "measure_matmul_flops", lambda *a, **k: calls.append(1) or next(rates))
    cpu = torch.device("cpu")
    key = throughput._measurement_key(cpu, torch.float32)
    stored = lambda: json.loads((tmp_path / throughput.CEILING_FILE).read_text())[key]["flops"]  # noqa: E731
    flops, source = throughput.peak_flops(cpu, torch.float32, tmp_path)
    assert flops == 50e9 and "measured under load" in source and stored() == 50e9  # stored: one figure for all runs
    assert throughput.peak_flops(cpu, torch.float32, tmp_path)[0] == 50e9 and len(calls) == 1  # read, not measured
    busy[0] = False  # a quiet moment: measured once more, and the higher figure kept
    assert throughput.peak_flops(cpu, torch.float32, tmp_path)[0] == 80e9 and stored() == 80e9
    assert "under load" not in throughput.peak_flops(cpu, torch.float32, tmp_path)[1] and len(calls) == 2
    busy[0] = True
    entry = throughput.measure_ceiling(cpu, torch.float32, tmp_path)  # a loaded measurement never lowers it
    assert entry["latest"] == 30e9 and entry["flops"] == 80e9 and stored() == 80e9
    assert throughput.measure_ceiling(cpu, torch.float32, tmp_path)["flops"] == 90e9 == stored()  # a higher one raises


def test_peak_command_shows_the_ceiling_without_writing(tmp_path, capsys):
    import json

    import torch

    from archspec.cli import main
    from archspec.train.throughput import _measurement_key

    key = _measurement_key(torch.device("cpu"), torch.float32)
    (tmp_path / "peak_flops.json").write_text(json.dumps(
        {key: {"flops": 123.4e9, "measured_at": "2026-11-30 12:00 UTC", "how": "test", "load_average": 0.1}}))
    before = (tmp_path / "peak_flops.json").read_bytes()
    assert main(["peak", "--device", "cpu", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "123.4 GFLOP/s" in out and "measured matmul rate" in out and "2026-11-30 12:00 UTC" in out
    assert (tmp_path / "peak_flops.json").read_bytes() == before
