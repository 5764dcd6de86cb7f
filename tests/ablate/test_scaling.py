"""Scaling-law fits: the fit against known laws, `archspec scaling` end to end on registries written through the real
write path (and on a tiny real sweep), and its refusals."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import yaml

from archspec.cli import main
from archspec.errors import UserError
from archspec.registry import Registry
from archspec.ablate.scaling import fit_power_law, fit_with_intervals, non_embedding_params
from archspec.train.logger import SweepMembership
from tests.registry.helpers import make_info, make_spec, record_run

TRUE = {"E": 1.8, "A": 40.0, "alpha": 0.3}


def law(x, E=TRUE["E"], A=TRUE["A"], alpha=TRUE["alpha"]):
    return E + A * np.power(np.asarray(x, dtype=float), -alpha)


def test_fit_recovers_known_law_from_noisy_seeds_inside_its_interval():
    rng = np.random.default_rng(7)
    x = np.geomspace(2e4, 2e6, 7)
    losses = [list(law(xi) + rng.normal(0, 0.02, 5)) for xi in x]
    r = fit_with_intervals(x, losses, n_boot=300)
    for name, truth in TRUE.items():
        lo, hi = r.interval[name]
        assert lo <= truth <= hi, (name, truth, r.interval[name])
        assert getattr(r.law, name) == pytest.approx(truth, rel=0.15)
    assert r.interval["alpha"][1] - r.interval["alpha"][0] < 0.1  # an interval that says something
    assert r.n_boot == 300 and r.boot.shape == (300, 3)
    # deterministic: the same points give the same interval
    assert fit_with_intervals(x, losses, n_boot=300).interval == r.interval


def test_fit_is_exact_on_noise_free_points_and_needs_three_sizes():
    x = [1e4, 3e4, 1e5, 3e5, 1e6]
    fit = fit_power_law(x, law(x))
    assert (fit.E, fit.A, fit.alpha) == pytest.approx((TRUE["E"], TRUE["A"], TRUE["alpha"]), rel=1e-5)
    with pytest.raises(UserError, match="2 distinct sizes, fewer than the 3 parameters"):
        fit_power_law([1e4, 1e4, 1e5, 1e5], law([1e4, 1e4, 1e5, 1e5]))
    one_seed = fit_with_intervals(x, [[v] for v in law(x)])
    assert one_seed.interval is None and "one run per size" in one_seed.note


# ── `archspec scaling` on registries written through the real write path ───────────────────────────────────────


def sizes(norm: str):
    """Five llama-like sizes of one architecture, as (spec, N) with N from the spec's real accounting."""
    out = []
    for i, (d, layers) in enumerate([(32, 1), (48, 2), (64, 2), (96, 3), (128, 4)]):
        spec = make_spec(f"s{i}", d_model=d, n_layers=layers, attention={"n_heads": 4},
                         ffn={"kind": "glu", "hidden_dim": 8 * (11 * d // 32)}, norm={"kind": norm})
        out.append(spec)
    return out


def write_runs(url, norm, truth, *, seeds=(0, 1, 2), sweep="synth", first_variant=0, tokens=lambda i: 1e6,
               noise=0.01, seed=0):
    rng = np.random.default_rng(seed)
    reg = Registry(url)
    expected = {}
    for i, spec in enumerate(sizes(norm)):
        info = make_info(spec)
        n = non_embedding_params(info.accounting)
        expected[n] = spec
        for s in seeds:
            run = dataclasses.replace(make_info(spec, seed=s), sweep=SweepMembership(
                sweep, first_variant + i, f"size {i}, {norm}", "h", first_variant))
            record_run(reg, run, {"val_loss": [(10, float(law(n, **truth)) + rng.normal(0, noise))]},
                       summary={"val_loss": float(law(n, **truth)) + rng.normal(0, noise), "tokens": tokens(i)})
    return expected


def test_scaling_fits_two_architectures_of_one_sweep_one_each(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    other = {"E": 1.5, "A": 25.0, "alpha": 0.25}
    ns = write_runs(url, "rmsnorm", TRUE, seed=1)
    write_runs(url, "layernorm", other, first_variant=5, seed=2)
    out_dir = tmp_path / "plots"
    assert main(["scaling", "synth", "--registry", url, "--json", "--out", str(out_dir), "--bootstrap", "200"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runs"] == 30 and report["skipped"] == []
    fits = {f["label"]: f for f in report["fits"]}
    assert set(fits) == {"norm.kind=rmsnorm", "norm.kind=layernorm"}  # the sizes' keys do not split groups
    for label, truth in (("norm.kind=rmsnorm", TRUE), ("norm.kind=layernorm", other)):
        f = fits[label]
        assert f["over"] == "params" and len(f["points"]) == 5
        assert all(p["n"] == 3 and p["tokens"] == 1e6 for p in f["points"])
        lo, hi = f["interval"]["alpha"]
        assert lo <= truth["alpha"] <= hi and f["fit"]["alpha"] == pytest.approx(truth["alpha"], abs=0.05)
    # x is N: the recorded accounting's active params less embeddings (tied head), as `archspec.accounting` counts
    from archspec.accounting import account

    rms = sorted(p["x"] for p in fits["norm.kind=rmsnorm"]["points"])
    assert rms == sorted(ns)
    spec = ns[rms[0]]
    acc = account(spec, seq_len=spec.train.seq_len)
    assert rms[0] == acc.active - acc.embedding
    png = out_dir / "synth-scaling.png"
    assert report["png"] == str(png) and png.stat().st_size > 20_000

    # --where selects runs across sweeps; one architecture, one fit; the table form names α and its interval
    assert main(["scaling", "--where", "params.model.norm.kind = 'layernorm'", "--registry", url,
                 "--out", str(out_dir), "--bootstrap", "100"]) == 0
    text = capsys.readouterr().out
    assert "all runs" in text and "α" in text and "95% CI" in text and "layernorm" not in text.split("\n")[0]


def test_varying_budgets_fit_over_compute(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    write_runs(url, "rmsnorm", TRUE, tokens=lambda i: 1e5 * (i + 1))
    assert main(["scaling", "synth", "--registry", url, "--json", "--bootstrap", "50", "--out", str(tmp_path)]) == 0
    fit = json.loads(capsys.readouterr().out)["fits"][0]
    assert fit["over"] == "compute" and fit["x"].startswith("training compute")
    rows = {r.id: r for r in Registry(url).runs()}
    for p in fit["points"]:
        row = rows[p["run_ids"][0]]
        assert p["x"] == row.accounting["flops_per_token"]["train"] * row.summary["tokens"]
    # a fit over parameters across budgets is refused with the reason
    assert main(["scaling", "synth", "--registry", url, "--over", "params", "--out", str(tmp_path)]) == 2
    assert "different token counts" in capsys.readouterr().err


def test_bad_inputs_exit_2_with_the_reason(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    missing = tmp_path / "none.db"
    cases = [
        (["scaling", "nope", "--registry", f"sqlite:///{missing}"], "no runs in the registry"),
        (["scaling", "--registry", url], "give a SWEEP"),
        (["scaling", "synth", "--where", "seed = 0", "--registry", url], "not both"),
        (["scaling", "--where", "metrics.val_loss <", "--registry", url], "val_loss"),
        (["scaling", "synth", "--by", "params.model.nrom", "--registry", url], "--by"),
    ]
    write_runs(url, "rmsnorm", TRUE, seeds=(0,))
    for argv, reason in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert reason in err and "Traceback" not in err, (argv, err)
    assert not missing.exists()  # a read creates no registry
    # two sizes only: fewer points than the law's three parameters
    assert main(["scaling", "--where", "params.model.d_model <= 48", "--registry", url]) == 2
    err = capsys.readouterr().err
    assert "2 distinct sizes, fewer than the 3 parameters" in err


def test_scaling_on_a_real_tiny_sweep(workdir, base_spec, capsys):
    """Three real sizes trained through `archspec ablate`, then fitted: N from the runs' own accounting."""
    sweep = {"name": "tiny-scaling", "base": base_spec, "seeds": [0], "budget": {"steps": 3},
             "zip": {"model.d_model": [16, 32, 48], "model.ffn.hidden_dim": [32, 64, 96]}}
    path = workdir / "tiny-scaling.yaml"
    path.write_text(yaml.safe_dump(sweep))
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--json"]) == 0
    capsys.readouterr()
    assert main(["scaling", str(path), "--registry", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (fit,) = report["fits"]
    runs = {r.id: r for r in Registry(url).runs()}
    assert [p["n"] for p in fit["points"]] == [1, 1, 1] and fit["interval"] is None
    for p in fit["points"]:
        row = runs[p["run_ids"][0]]
        acc = row.accounting["params"]
        assert p["x"] == acc["active"] - acc["embedding"] and p["mean"] == row.summary["val_loss"]
    assert (workdir / "reports" / "tiny-scaling" / "tiny-scaling-scaling.png").exists()
    # --steps selects the runs `ablate --steps N` trained: none at 5 steps; a sweep name cannot take it
    assert main(["scaling", str(path), "--registry", url, "--steps", "5"]) == 2
    assert "no runs in the registry" in capsys.readouterr().err
    assert main(["scaling", "tiny-scaling", "--registry", url, "--steps", "3"]) == 2
    assert "need a sweep file" in capsys.readouterr().err


def test_n_is_active_non_embedding_params_for_moe_and_untied_heads():
    from archspec.accounting import account

    moe = make_spec("moe", ffn={"kind": "moe", "n_experts": 8, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": 64}},
                    tie_embeddings=False)
    acc = account(moe, seq_len=moe.train.seq_len)
    n = non_embedding_params(make_info(moe).accounting)
    assert n == acc.active - acc.embedding - acc.by_component["lm_head"]
    assert n < acc.total - acc.embedding - acc.by_component["lm_head"] and acc.by_component["lm_head"] > 0
