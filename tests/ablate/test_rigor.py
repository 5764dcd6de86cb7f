"""What makes a verdict trustworthy beyond the interval itself: more seeds on demand (--add-seeds), main effects of a
multi-factor grid, curves with enough points at any budget, one validation set for every variant, and values shown
as the spec writes them."""

from __future__ import annotations

import json

import pytest
import yaml

from archspec.ablate.report import (RunResult, VariantResult, effect_rows, grid_factors, label_overrides,
                                    main_effects, render_html, table_rows)
from archspec.ablate.stats import combination
from archspec.ablate.sweep import load_sweep, spec_text
from archspec.cli import main
from archspec.registry import Registry


def cell(index, overrides, finals):
    runs = [RunResult(f"r{index}-{i}", i, "FINISHED", x, 1000.0, [(1, x)], 64, {"val_loss": x})
            for i, x in enumerate(finals)]
    label = ", ".join(f"{k}={v}" for k, v in overrides.items())
    return VariantResult(index, label, {}, 100, 100, 600, 512, runs, overrides=overrides)


# A 2 × 2 grid, norm × n_kv_heads: the norm matters (+0.5), the heads do not.
GRID = [
    cell(0, {"model.norm": "{kind: layernorm, bias: true}", "model.attention.n_kv_heads": "2"}, [3.0, 3.1, 3.2]),
    cell(1, {"model.norm": "{kind: layernorm, bias: true}", "model.attention.n_kv_heads": "1"}, [3.05, 3.0, 3.1]),
    cell(2, {"model.norm": "{kind: rmsnorm}", "model.attention.n_kv_heads": "2"}, [3.5, 3.6, 3.55]),
    cell(3, {"model.norm": "{kind: rmsnorm}", "model.attention.n_kv_heads": "1"}, [3.6, 3.5, 3.65]),
]


def test_main_effects_are_marginal_means_with_welch_satterthwaite_intervals():
    effects = {(e["factor"], e["level"]): e for e in main_effects(GRID, 0)}
    assert set(effects) == {("model.norm", "{kind: layernorm, bias: true}"), ("model.norm", "{kind: rmsnorm}"),
                            ("model.attention.n_kv_heads", "2"), ("model.attention.n_kv_heads", "1")}
    rms = effects[("model.norm", "{kind: rmsnorm}")]
    # marginal mean: the mean of the level's two cell means; Δ against the baseline's level (layernorm)
    assert rms["mean"] == pytest.approx((3.55 + 3.5833333) / 2, abs=1e-6)
    expected = combination([(0.5, GRID[2].finals), (0.5, GRID[3].finals), (-0.5, GRID[0].finals),
                            (-0.5, GRID[1].finals)])
    assert (rms["delta"], rms["ci_low"], rms["ci_high"], rms["dof"]) == (
        expected.estimate, expected.low, expected.high, expected.dof)
    assert rms["verdict"] == "worse" and rms["cells"] == 2 and rms["n"] == 6
    assert effects[("model.attention.n_kv_heads", "1")]["verdict"] == "inconclusive"
    assert effects[("model.norm", "{kind: layernorm, bias: true}")]["verdict"] == "reference"
    # the marginal mean's own interval: the same combination without the reference
    only = combination([(0.5, GRID[2].finals), (0.5, GRID[3].finals)])
    assert (rms["mean_low"], rms["mean_high"]) == (only.low, only.high)
    rows = effect_rows(main_effects(GRID, 0))
    assert rows[0]["level"].endswith("(baseline's)") and rows[1]["95% CI"].startswith("[+")


def test_factors_come_back_from_labels_and_zip_keys_are_one_factor():
    assert label_overrides("model.ffn={kind: mlp, activation: gelu}, model.attention.n_kv_heads=1") == {
        "model.ffn": "{kind: mlp, activation: gelu}", "model.attention.n_kv_heads": "1"}
    assert label_overrides("base") == {}
    zipped = [cell(i, {"model.d_model": d, "model.attention.n_heads": h, "model.norm.kind": n}, [1.0, 1.1])
              for i, (d, h, n) in enumerate([("64", "2", "layernorm"), ("64", "2", "rmsnorm"),
                                             ("128", "4", "layernorm"), ("128", "4", "rmsnorm")])]
    factors = grid_factors(zipped)
    assert [f.keys for f in factors] == [["model.d_model", "model.attention.n_heads"], ["model.norm.kind"]]
    assert factors[0].levels == ["64, 2", "128, 4"]
    assert main_effects(GRID[:2], 0) == []  # one factor: the cell table says it all


def test_values_show_as_the_spec_writes_them(tmp_path):
    assert spec_text({"kind": "rope", "scaling": None, "bias": True, "eps": 1e-05}) == \
        "{kind: rope, scaling: null, bias: true, eps: 1e-05}"
    assert spec_text([False, None, 2]) == "[false, null, 2]"
    v = cell(1, {}, [3.0, 3.1])
    v.diff = {"model.attention.positional.scaling": (None, True)}
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG")
    html = render_html("t", table_rows([v], 1), png, [v], {}, effect_rows(main_effects(GRID, 0)))
    assert "<code>null</code>" in html and "<code>true</code>" in html and "None" not in html and "True" not in html
    assert "Main effects" in html and "marginal val loss" in html


def write(workdir, base_spec, name="grid", **extra):
    sweep = {"name": name, "base": base_spec, "seeds": [0], "budget": {"steps": 3},
             "grid": {"model.norm.kind": ["layernorm", "rmsnorm"]}, **extra}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_add_seeds_trains_only_the_new_runs_and_the_report_holds_every_seed(workdir, base_spec, capsys):
    path = write(workdir, base_spec)
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--json"]) == 0
    capsys.readouterr()
    before = {r.id: r.ended for r in Registry(url).runs()}
    assert len(before) == 2

    assert main(["ablate", str(path), "--registry", url, "--add-seeds", "2", "--json"]) == 0
    out = capsys.readouterr()
    assert "adding seeds 1, 2" in out.err and "4 trained, 0 already finished" in out.err
    runs = Registry(url).runs(where="sweep = 'grid'")
    assert len(runs) == 6 and {r.seed for r in runs} == {0, 1, 2}
    assert {r.id: r.ended for r in runs if r.id in before} == before  # the first runs were not touched
    report = json.loads(out.out)
    assert [v["n"] for v in report["variants"]] == [3, 3]
    assert report["variants"][1]["ci_low"] is not None  # three seeds a side: now there is an interval

    # a report rebuilt later from the sweep file (seeds: [0]) or the registry alone holds every seed too
    for target in (str(path), "grid"):
        assert main(["report", target, "--registry", url, "--json", "--out", str(workdir / "again")]) == 0
        assert [v["n"] for v in json.loads(capsys.readouterr().out)["variants"]] == [3, 3]
    # the next extension continues from the highest seed
    assert main(["ablate", str(path), "--registry", url, "--add-seeds", "1", "--dry-run"]) == 0
    assert "adding seeds 3" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--add-seeds", "0"], "--add-seeds"),
    (["--add-seeds", "-1"], "--add-seeds"),
    (["--add-seeds", "x"], "--add-seeds"),
    (["--add-seeds", "1"], "has no runs in the registry"),
    (["--add-seeds", "1", "--seeds", "4,5"], "give one"),
])
def test_add_seeds_refuses_bad_input(workdir, base_spec, capsys, args, message):
    path = write(workdir, base_spec)
    assert main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (workdir / "runs").exists()


def test_add_seeds_on_an_unknown_sweep_file_exits_2(workdir, capsys):
    assert main(["ablate", str(workdir / "nope.yaml"), "--add-seeds", "2"]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_eval_spacing_follows_the_budget_and_the_validation_set_is_one_for_all(workdir, base_spec, capsys):
    for steps, interval in ((3, 1), (40, 4), (1000, 100), (95, 10)):
        sweep = load_sweep(write(workdir, base_spec, budget={"steps": steps}))
        assert {v.spec.train.eval_interval for v in sweep.variants} == {interval}
    sweep = load_sweep(write(workdir, base_spec, budget={"steps": 40}, eval_points=4))
    assert sweep.variants[0].spec.train.eval_interval == 10
    # a grid that sets the interval itself is obeyed
    sweep = load_sweep(write(workdir, base_spec, budget={"steps": 40}, zip={"train.eval_interval": [7, 8]},
                             grid={"model.norm.kind": ["rmsnorm"]}))
    assert [v.spec.train.eval_interval for v in sweep.variants] == [7, 8]
    # a grid that gives the variants different validation sets is refused
    path = write(workdir, base_spec, grid={"train.eval_tokens": [64, 128]})
    assert main(["ablate", str(path), "--dry-run"]) == 2
    assert "train.eval_tokens: every variant is evaluated on the same validation set" in capsys.readouterr().err
