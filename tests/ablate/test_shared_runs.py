"""Sweeps share runs: a run is keyed by content (model, learning recipe, data, seed), never by a spec or sweep name,
and belongs to every sweep that holds it."""

from __future__ import annotations

import json

import yaml

from archspec.ablate.runner import run_jobs
from archspec.ablate.sweep import load_sweep
from archspec.cli import main
from archspec.registry import Registry


def test_two_sweeps_holding_one_experiment_train_it_once_and_both_reports_show_it(workdir, base_spec, capsys):
    url = f"sqlite:///{workdir / 'reg.db'}"
    paths = {}
    for name, points in (("alpha", 1), ("beta", 2)):  # eval cadence is observation, not identity
        paths[name] = workdir / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump({"name": name, "base": base_spec, "seeds": [0], "budget": {"steps": 2},
                                               "eval_points": points}))
    assert [load_sweep(paths[n]).variants[0].spec.train.eval_interval for n in ("alpha", "beta")] == [2, 1]

    first = run_jobs(load_sweep(paths["alpha"]), load_sweep(paths["alpha"]).jobs, url)
    second = run_jobs(load_sweep(paths["beta"]), load_sweep(paths["beta"]).jobs, url)
    assert first.count("trained") == 1 and second.count("trained") == 0
    assert second.count("skipped (finished)") == 1
    (run,) = Registry(url).runs()
    assert run.id == first.outcomes[0].run_id == second.outcomes[0].run_id
    assert run.sweeps == ["alpha", "beta"] and "alpha" not in run.id and run.name == "alpha-v0"

    for name in ("alpha", "beta"):
        for target in (name, str(paths[name])):  # by sweep name (registry alone) and with the sweep file
            assert main(["report", target, "--registry", url, "--json", "--out", str(workdir / "r" / name)]) == 0
            report = json.loads(capsys.readouterr().out)
            (variant,) = report["variants"]
            assert [r["run_id"] for r in variant["runs"]] == [run.id] and variant["n"] == 1
