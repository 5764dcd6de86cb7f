"""A learning rate per variant (sweep `lr_sweep`): pilots at every rate, the other seeds at each variant's best rate,
dedupe and --add-seeds through the one run key."""

from __future__ import annotations

import json

import pytest
import yaml

from archspec.ablate.rates import RatePoint, best_rate
from archspec.ablate.sweep import load_sweep
from archspec.cli import main
from archspec.errors import UserError
from archspec.registry import Registry

BASE = {"name": "b", "model": {"vocab_size": 300, "context_length": 32, "d_model": 32, "n_layers": 1,
                               "attention": {"n_heads": 4}}, "train": {"steps": 4, "warmup_steps": 1}}


def test_best_rate_rule():
    P = RatePoint
    assert best_rate([P(1e-3, "FINISHED", 2.0), P(1e-2, "FINISHED", 1.5)]) == 1e-2
    assert best_rate([P(1e-3, "FINISHED", 2.0), P(1e-2, "FAILED", None)]) == 1e-3  # a diverged pilot never wins
    assert best_rate([P(3e-3, "FINISHED", 2.0), P(1e-3, "FINISHED", 2.0)]) == 1e-3  # ties: the smaller rate
    assert best_rate([P(1e-3, "FINISHED", 2.0), P(1e-2, None, None)]) is None  # not decided while a pilot is missing
    assert best_rate([P(1e-3, "FINISHED", 2.0), P(1e-2, "RUNNING", None)]) is None
    assert best_rate([P(1e-3, "FAILED", None), P(1e-2, "FAILED", None)]) is None


def test_pilots_then_seeds_at_the_best_rate():
    s = load_sweep(data={"name": "s", "base": BASE, "seeds": [5, 6, 7], "grid": {"model.n_layers": [1, 2]},
                         "lr_sweep": [1e-3, 3e-3, 1e-2]})
    assert [(j.variant.index, j.seed, j.spec.train.lr) for j in s.jobs] == [
        (v, 5, lr) for v in (0, 1) for lr in (1e-3, 3e-3, 1e-2)]
    assert len({j.key for j in s.jobs}) == len(s.jobs)
    assert len(s.all_jobs()) == 2 * 3 * 3
    later = s.seed_jobs({0: 3e-3})  # variant 1 not decided: none of its seeds
    assert [(j.variant.index, j.seed, j.spec.train.lr) for j in later] == [(0, 6, 3e-3), (0, 7, 3e-3)]
    plain = load_sweep(data={"name": "s", "base": BASE, "seeds": [5, 6, 7], "grid": {"model.n_layers": [1, 2]}})
    assert plain.sweep_hash != s.sweep_hash and all(j.lr is None for j in plain.jobs)


@pytest.mark.parametrize("kw,message", [
    ({"lr_sweep": [1e-3]}, "lr_sweep"),
    ({"lr_sweep": [1e-3, 1e-3]}, "repeated rate"),
    ({"lr_sweep": [1e-3, -1.0]}, "lr_sweep"),
    ({"lr_sweep": [1e-3, 1e-2], "grid": {"train.lr": [1e-3, 1e-2]}}, "give the rates in one of them"),
])
def test_bad_lr_sweeps(kw, message):
    with pytest.raises(UserError) as e:
        load_sweep(data={"name": "s", "base": BASE, **kw})
    assert message in e.value.render()


def test_lr_sweep_end_to_end_dedupe_and_add_seeds(workdir, base_spec, capsys):
    path = workdir / "lr.yaml"
    path.write_text(yaml.safe_dump({"name": "lr", "base": base_spec, "seeds": [0, 1], "budget": {"steps": 3},
                                    "grid": {"model.norm.kind": ["layernorm", "rmsnorm"]},
                                    "lr_sweep": [1e-4, 3e-3]}))
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--json", "--no-compile"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    registry = Registry(url)
    runs = registry.runs(where="sweep = 'lr'")
    assert len(runs) == 2 * 2 + 2, out.err  # every pilot, then one more seed per variant at its best rate
    for v in report["variants"]:
        pilots = {p["lr"]: p for p in v["rates"]}
        assert set(pilots) == {1e-4, 3e-3} and all(p["status"] == "FINISHED" for p in pilots.values())
        assert v["best_lr"] == min(pilots, key=lambda lr: (pilots[lr]["val_loss"], lr))
        at_best = [r for r in runs if r.memberships["lr"].variant == v["index"] and r.recipe["lr"] == v["best_lr"]]
        assert {r.seed for r in at_best} == {0, 1} and v["n"] == 2  # compared at its own best rate, both seeds
        assert {r["run_id"] for r in v["runs"]} == {r.id for r in at_best}
    assert "best rates" in out.err and "pilot seed 0" in (workdir / "reports" / "lr" / "lr.html").read_text()
    assert (workdir / "reports" / "lr" / "lr-lr.png").exists()

    # a second run trains nothing: the run keys are the loop's (train/build.py prepare → run_key)
    assert main(["ablate", str(path), "--registry", url, "--json", "--no-compile"]) == 0
    assert "0 trained" in capsys.readouterr().err
    # --add-seeds: new seeds at each variant's best rate only, the pilots untouched
    assert main(["ablate", str(path), "--registry", url, "--json", "--no-compile", "--add-seeds", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    runs = Registry(url).runs(where="sweep = 'lr'")
    assert len(runs) == 6 + 2
    for v in report["variants"]:
        assert v["n"] == 3 and {r.recipe["lr"] for r in runs if r.seed == 2
                                and r.memberships["lr"].variant == v["index"]} == {v["best_lr"]}
    # `archspec report` by name alone reads the same best rates from the registry
    assert main(["report", "lr", "--registry", url, "--json", "--out", str(workdir / "again")]) == 0
    by_name = json.loads(capsys.readouterr().out)
    assert [v["best_lr"] for v in by_name["variants"]] == [v["best_lr"] for v in report["variants"]]
