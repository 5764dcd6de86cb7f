"""`ablate --dry-run` time estimates: from the throughput the registry measured, else from the stated assumption."""

from __future__ import annotations

import statistics

import pytest
import yaml

from archspec.ablate.estimate import ASSUMED_MFU, Measured, Work, cost_model, estimate, measured_runs
from archspec.cli import main
from archspec.registry import Registry
from tests.registry.helpers import make_info, make_spec, record_run


def measured(flops: float, tok_s: float, model_hash: str = "h", batch=(8, 128)) -> Measured:
    return Measured(model_hash, "m", batch, flops, tok_s, True)


def work(flops: float, steps: int = 100, tokens_per_step: int = 1024) -> Work:
    return Work(steps, tokens_per_step, flops, flops / 3, evals=0, eval_batches=0, eval_tokens=0)


def test_estimate_sources_in_order():
    # three models on one line: 10 ms of overhead per step plus FLOPs at 50 GFLOP/s (1024 tokens a step)
    line = [measured(f, 1024 / (10e-3 + 1024 * f / 50e9), model_hash=str(f)) for f in (1e5, 1e6, 4e6)]
    m = cost_model(line, peak=None)
    assert m.step_overhead == pytest.approx(10e-3, rel=1e-6) and 1 / m.inv_rate == pytest.approx(50e9, rel=1e-6)
    between = estimate("other", (8, 128), work(2e6), line, peak=1e12)
    assert between.seconds == pytest.approx(100 * (10e-3 + 1024 * 2e6 / 50e9)) and between.basis == "fit to 3 measured models"
    # the same model at the same batch: its own median rate
    same = estimate("1000000.0", (8, 128), work(1e6), line + [measured(1e6, 1000.0, "1000000.0")], peak=1e12)
    assert same.basis.startswith("same model (2 runs)")
    assert same.train_s == pytest.approx(100 * statistics.median([1024 / 1000.0, 10e-3 + 1024 * 1e6 / 50e9]))
    # one measured model: its achieved FLOP/s (or the assumption, when faster) and the overhead left over
    (one,) = line[1:2]
    m1 = cost_model([one], peak=1e9)  # 20% of 1 GFLOP/s is slower than what it achieved
    assert 1 / m1.inv_rate == pytest.approx(one.flops_per_s) and m1.step_overhead == pytest.approx(0.0, abs=1e-12)
    m2 = cost_model([one], peak=1e12)
    assert 1 / m2.inv_rate == pytest.approx(1e12 * ASSUMED_MFU)
    assert m2.step_overhead == pytest.approx(one.step_s - 1024 * 1e6 / 2e11)
    # nothing measured: the stated assumption
    assumed = estimate("x", (8, 128), work(2e6), [], peak=1e12)
    assert assumed.seconds == pytest.approx(2e6 * 102_400 / (1e12 * ASSUMED_MFU)) and assumed.basis == "assumed 20% MFU"


def _record(reg, spec, tok_s, device="cpu", precision="float32", seed=0):
    info = make_info(spec, seed=seed, tags={"device": device, "precision": precision, "world_size": "1"})
    record_run(reg, info, {"val_loss": [(1, 3.0)]}, summary={"val_loss": 3.0, "tokens_per_s": tok_s})


def test_dry_run_uses_measured_runs_of_the_same_device_kind(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    reg = Registry(url)
    small, big = make_spec("small", d_model=32), make_spec("big", d_model=96)
    _record(reg, small, 20_000.0)
    _record(reg, big, 8_000.0)
    _record(reg, big, 1e9, device="cuda:0", precision="bfloat16", seed=1)  # another device kind: not used on CPU
    assert len(measured_runs(reg, "cpu", "auto")) == 2 and len(measured_runs(reg, "cuda", "auto")) == 1

    sweep = {"name": "est", "base": {"name": "b", "model": make_spec("b").model.model_dump(mode="json"),
                                     "train": {"steps": 10, "warmup_steps": 2, "batch_size": 2, "seq_len": 16}},
             "seeds": [0], "grid": {"model.d_model": [32, 64]}}
    path = tmp_path / "est.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert main(["ablate", str(path), "--registry", url, "--dry-run", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "times from 2 finished cpu run(s) on other hosts" in out
    assert "fit to 2 measured models" in out  # the batch differs from the recorded runs': no same-model rate

    missing = tmp_path / "none.db"
    assert main(["ablate", str(path), "--registry", f"sqlite:///{missing}", "--dry-run", "--device", "cpu"]) == 0
    assert "no finished cpu run in the registry to measure from: times assume 20%" in capsys.readouterr().out
    assert not missing.exists()  # a dry run reads the registry, never creates it


def test_each_run_pays_the_cheapest_setup_measured():
    """A run's data, module and model are made before it is recorded (outside started → ended): the estimate adds the
    cheapest setup its measured runs paid (a dearer one also paid once-only costs, such as a first tokenising)."""
    from dataclasses import replace

    base = measured(1e6, 1024 / 0.02)
    timed = [replace(base, wall_s=100 * 0.02 + 1.0, steps=100, setup_s=s) for s in (9.0, 2.5)]
    untimed_setup = cost_model([replace(t, setup_s=None) for t in timed], peak=None)
    with_setup = cost_model(timed, peak=None)
    assert with_setup.run_overhead == pytest.approx(untimed_setup.run_overhead + 2.5)
    assert (estimate("x", (8, 128), work(1e6), timed, peak=None).fixed_s
            == pytest.approx(estimate("x", (8, 128), work(1e6), [replace(t, setup_s=None) for t in timed],
                                      peak=None).fixed_s + 2.5))
