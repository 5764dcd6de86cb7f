"""Issue 33: report entry points find runs trained with ablate's options; estimates count every FLOP; co-varying keys
are one factor; the figure states each verdict; the HTML report carries the sweep's scaling fit."""

from __future__ import annotations

import pytest
import yaml

from archspec.ablate.estimate import Measured, Work, cost_model, estimate
from archspec.ablate.report import RunResult, VariantResult, figure_texts, grid_factors, main_effects, report_figure
from archspec.cli import main
from tests.ablate.test_scaling import TRUE, write_runs

# ── 1. `archspec report SWEEP_FILE` and `archspec scaling SWEEP_FILE` find runs trained with --steps/--seeds ────────


def test_report_by_file_finds_runs_trained_with_steps_and_seeds(workdir, base_spec, capsys):
    sweep = {"name": "opts", "base": base_spec, "seeds": [0, 1, 2], "budget": {"tokens": 100_000},
             "grid": {"model.norm.kind": ["layernorm", "rmsnorm"]}}
    path = workdir / "opts.yaml"
    path.write_text(yaml.safe_dump(sweep))
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--steps", "2", "--seeds", "0", "--json"]) == 0
    capsys.readouterr()
    # the same options select exactly the runs ablate trained
    assert main(["report", str(path), "--registry", url, "--steps", "2", "--seeds", "0", "--json"]) == 0
    out = capsys.readouterr()
    assert '"n=1"' not in out.out and "(n=1)" in out.out and "note:" not in out.err
    # the file alone: its budget has no runs, so the sweep's members are shown, with a note that says so
    assert main(["report", str(path), "--registry", url, "--json"]) == 0
    out = capsys.readouterr()
    assert "(n=1)" in out.out and "note:" in out.err and "steps 2" in out.err
    # options that trained nothing: the error names what was looked for and the command that trains it
    assert main(["report", str(path), "--registry", url, "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "looked for runs of the 2 variant(s)" in err and '{"steps": 3}' in err
    assert f"archspec ablate {path} --steps 3" in err.replace("\n", "")
    # by name and `archspec scaling` find them through the same path
    assert main(["report", "opts", "--registry", url, "--json"]) == 0
    capsys.readouterr()
    assert main(["scaling", str(path), "--registry", url, "--steps", "3"]) == 2
    assert "archspec ablate" in capsys.readouterr().err


# ── 2. estimates count evaluation, and scale with the model's FLOPs ─────────────────────────────────────────────


def _measured(flops_per_step: float, step_s: float, eval_batches: int, eval_flops: float, wall_extra: float,
              model_hash: str) -> Measured:
    batch = (8, 128)
    steps = 40
    return Measured(model_hash, "m", batch, flops_per_step / (8 * 128), 8 * 128 / step_s, True,
                    wall_s=steps * step_s + wall_extra, steps=steps, eval_batches=eval_batches, eval_flops=eval_flops)


def test_estimate_counts_evaluation_and_scales_with_flops():
    # a machine: 20 ms per step + FLOPs at 1 GFLOP/s; 5 ms per eval batch; 2 s per run
    a, rate, b, c = 0.02, 1e9, 0.005, 2.0

    def run(f_step, batches, f_eval, h):
        return _measured(f_step, a + f_step / rate, batches, f_eval, batches * b + f_eval / rate + c, h)

    measured = [run(1e7, 64, 2e8, "s"), run(1e8, 640, 2e9, "m"), run(1e9, 128, 4e9, "l")]
    model = cost_model(measured, peak=1e11)
    assert model.step_overhead == pytest.approx(a, rel=1e-6) and 1 / model.inv_rate == pytest.approx(rate, rel=1e-6)
    assert model.batch_overhead == pytest.approx(b, rel=1e-4) and model.run_overhead == pytest.approx(c, rel=1e-4)

    def work(flops_per_token, evals=10):  # the presets at --steps 40: 10 evals of 64k tokens, 16x the training tokens
        return Work(steps=40, tokens_per_step=1024, flops_train_per_token=flops_per_token,
                    flops_forward_per_token=flops_per_token / 3, evals=evals, eval_batches=64, eval_tokens=65_536)

    small, big = (estimate("new", (8, 128), work(f), measured, peak=1e11) for f in (2e5, 7e6))
    assert small.eval_s == pytest.approx(10 * 64 * b + 10 * 65_536 * 2e5 / 3 / rate)
    assert small.train_s == pytest.approx(40 * (a + 1024 * 2e5 / rate))
    assert small.seconds == pytest.approx(small.train_s + small.eval_s + c)
    assert big.seconds > 10 * small.seconds  # 35x the FLOPs: not the same "9 s" for every size
    no_eval = estimate("new", (8, 128), work(2e5, evals=0), measured, peak=1e11)
    assert small.seconds - no_eval.seconds == pytest.approx(small.eval_s) and small.eval_s > small.train_s

    # measured models that disagree with FLOPs (a noisy small one slower than a big one) still cost by FLOPs:
    # the rate is bounded by the device's peak
    noisy = [_measured(1e7, 0.5, 64, 2e8, 1.0, "s"), _measured(1e9, 0.3, 64, 2e10, 1.0, "l")]
    m = cost_model(noisy, peak=1e10)
    assert 1 / m.inv_rate <= 1e10 * (1 + 1e-9)
    tiny, large = (estimate("x", (8, 128), work(f), noisy, peak=1e10) for f in (3e4, 1.2e6))
    assert large.seconds > tiny.seconds


# ── 3. keys that co-vary (a zip) are one factor ────────────────────────────────────────────────────────────────


def _variant(index: int, overrides: dict[str, str], finals=(3.0, 3.1)) -> VariantResult:
    runs = [RunResult(f"r{index}{i}", i, "FINISHED", x, 1000.0, [(10, x + 1.0), (20, x)], 256, {"val_loss": x})
            for i, x in enumerate(finals)]
    return VariantResult(index, ", ".join(f"{k}={v}" for k, v in overrides.items()), {}, 100, 100, 600, 512, runs,
                         overrides=overrides)


def test_co_varying_factors_are_one_factor():
    d_model, layers = [32, 48, 64, 96, 128, 160], [2, 2, 2, 2, 3, 4]
    scaling = [_variant(i, {"model.d_model": str(d), "model.n_layers": str(n)}) for i, (d, n) in
               enumerate(zip(d_model, layers))]
    (factor,) = grid_factors(scaling)
    assert factor.name == "model.d_model+model.n_layers" and len(factor.levels) == 6
    assert main_effects(scaling, 4) == []  # one factor: the cell table is its main effect
    # a grid (norm) × a zip (sizes): two crossed factors, the zip's keys still one
    crossed = [_variant(2 * i + j, {"model.norm.kind": norm, "model.d_model": str(d), "model.n_layers": str(n)})
               for i, (d, n) in enumerate([(32, 2), (64, 2), (96, 3)]) for j, norm in enumerate(["layernorm", "rmsnorm"])]
    names = sorted(f.name for f in grid_factors(crossed))
    assert names == ["model.d_model+model.n_layers", "model.norm.kind"]
    assert {e["factor"] for e in main_effects(crossed, 0)} == set(names)


# ── 4. the figure states each verdict; the HTML report carries the scaling fit ─────────────────────────────────


def test_figure_carries_each_verdict_and_a_final_loss_panel():
    import matplotlib.pyplot as plt

    variants = [_variant(0, {"model.norm.kind": "layernorm"}, (4.80, 4.81, 4.79)),
                _variant(1, {"model.norm.kind": "rmsnorm"}, (4.70, 4.71, 4.69))]
    fig = report_figure("norm", variants, 0)
    texts = figure_texts(fig)
    assert any("v0" in t and "baseline" in t for t in texts)
    (v1,) = [t for t in texts if t.startswith("v1:")]
    assert "Δ -0.1000" in v1 and "better" in v1 and "[" in v1  # the delta, its interval and the verdict
    final = fig.axes[2]
    lo, hi = final.get_ylim()
    assert 4.6 < lo < 4.69 and 4.81 < hi < 4.9  # the range of the finals' spread: the gap is visible
    plt.close(fig)


def test_html_report_includes_the_scaling_fit(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    write_runs(url, "rmsnorm", TRUE, seed=3)
    out = tmp_path / "rep"
    assert main(["report", "synth", "--registry", url, "--out", str(out)]) == 0
    html = (out / "synth.html").read_text()
    assert "<h2>Scaling fit</h2>" in html and "α 95% CI" in html and 'alt="scaling fit"' in html
    assert (out / "synth-scaling.png").exists()


def test_a_sweep_over_kinds_has_no_fit():
    from archspec.ablate.scaling import sweep_fits

    assert sweep_fits([], ["model.norm.kind"]) is None
