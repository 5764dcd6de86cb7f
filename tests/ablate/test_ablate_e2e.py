"""End to end: a tiny sweep into SQLite, its report against the registry, resume after a kill, refusal."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from archspec.ablate.runner import collect, run_jobs
from archspec.ablate.sweep import load_sweep
from archspec.cli import main
from archspec.registry import Registry, RegistryLogger


def write_sweep(workdir, base_spec, **extra):
    sweep = {"name": "mini", "base": base_spec, "seeds": [0, 1], "budget": {"steps": 4},
             "grid": {"model.norm.kind": ["layernorm", "rmsnorm"]}, **extra}
    path = workdir / "mini.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_sweep_end_to_end_report_matches_registry(workdir, base_spec, capsys):
    path = write_sweep(workdir, base_spec)
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    runs = Registry(url).runs(where="sweep = 'mini'")
    assert len(runs) == 4 and {r.status for r in runs} == {"FINISHED"}
    by_variant = {}
    for r in runs:
        by_variant.setdefault(r.memberships["mini"].variant, []).append(r)
    rows = {row["variant"].split()[0]: row for row in report["rows"]}
    for index, vruns in by_variant.items():
        finals = [r.summary["val_loss"] for r in vruns]
        # the final val loss is the last logged val_loss point, and the table shows mean ± std of those
        for r in vruns:
            assert r.summary["val_loss"] == r.metrics["val_loss"]
            # evaluation spacing follows the budget: ten points a curve, here every one of the 4 steps
            assert [p.step for p in Registry(url).metric_history(r.id, "val_loss")] == [1, 2, 3, 4]
        assert rows[f"v{index}"]["val loss"] == (
            f"{statistics.fmean(finals):.4f} ± {statistics.stdev(finals):.4f} (n=2)")
        assert rows[f"v{index}"]["params"].endswith("k")
    delta = (statistics.fmean(r.summary["val_loss"] for r in by_variant[1])
             - statistics.fmean(r.summary["val_loss"] for r in by_variant[0]))
    assert rows["v1"]["Δ vs baseline"] == f"{delta:+.4f}"
    assert rows["v1"]["verdict"] in ("inconclusive", "better", "worse")
    assert rows["v1"]["95% CI"].startswith("[")
    html = (workdir / "reports" / "mini" / "mini.html").read_text()
    assert "data:image/png;base64," in html and "model.norm.kind" in html
    assert (workdir / "reports" / "mini" / "mini.png").stat().st_size > 10_000

    # `archspec report` rebuilds the same table from the registry alone (by sweep name, no sweep file)
    assert main(["report", "mini", "--registry", url, "--json", "--out", str(workdir / "again")]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == report["rows"]
    # and a second `ablate` trains nothing
    sweep = load_sweep(path)
    outcome = run_jobs(sweep, sweep.jobs, url)
    assert outcome.count("skipped (finished)") == 4 and outcome.count("trained") == 0


class KillAfter(RegistryLogger):
    """Simulates Ctrl-C during the third metric batch of one run."""

    def __init__(self, url, calls):
        super().__init__(url)
        self.calls = calls

    def log_metrics(self, step, metrics):
        super().log_metrics(step, metrics)
        if step == 3 and "train_loss" in metrics:
            raise KeyboardInterrupt


def test_interrupted_sweep_resumes_without_redoing_finished_runs(workdir, base_spec):
    path = write_sweep(workdir, base_spec)
    url = f"sqlite:///{workdir / 'reg.db'}"
    sweep = load_sweep(path)
    made = []

    def factory():
        made.append(1)
        return KillAfter(url, made) if len(made) == 3 else RegistryLogger(url)

    with pytest.raises(KeyboardInterrupt):
        run_jobs(sweep, sweep.jobs, url, logger_factory=factory)
    reg = Registry(url)
    statuses = sorted(r.status for r in reg.runs(where="sweep = 'mini'"))
    assert statuses == ["FINISHED", "FINISHED", "KILLED"]
    killed = reg.runs(where="status = 'KILLED'")[0]
    assert [p.step for p in reg.metric_history(killed.id, "train_loss")] == [1, 2, 3]  # flushed metrics kept
    finished_before = {r.id: r.ended for r in reg.runs(where="status = 'FINISHED'")}

    outcome = run_jobs(sweep, sweep.jobs, url)
    assert outcome.count("skipped (finished)") == 2 and outcome.count("trained") == 2
    retrained = {o.run_id for o in outcome.outcomes if o.action == "trained"}
    assert killed.id in retrained and not retrained & set(finished_before)
    runs = reg.runs(where="sweep = 'mini'")
    assert len(runs) == 4 and {r.status for r in runs} == {"FINISHED"}
    assert {r.id: r.ended for r in runs if r.id in finished_before} == finished_before
    variants, baseline = collect(reg, "mini", sweep)
    assert len(variants) == 2 and baseline == 0


def test_invalid_variant_refuses_whole_sweep_before_training(workdir, base_spec, capsys):
    path = write_sweep(workdir, base_spec, grid={"model.attention.n_kv_heads": [2, 3]})
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url]) == 2
    err = capsys.readouterr().err
    assert "variant 1 (model.attention.n_kv_heads=3): model.attention.n_kv_heads: must divide n_heads (2), got 3" in err
    assert "nothing was trained" in err and "Traceback" not in err
    assert not (workdir / "runs").exists()
    assert Registry(url).runs() == []


def test_dry_run_trains_nothing(workdir, base_spec, capsys):
    path = write_sweep(workdir, base_spec)
    assert main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 variants × 2 seeds = 4 runs" in out and "est. time/run" in out
    assert not (workdir / "runs").exists()


def test_report_without_runs_is_a_clear_error(workdir, base_spec, capsys):
    path = write_sweep(workdir, base_spec)
    assert main(["report", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}"]) == 2
    assert "no runs in the registry" in capsys.readouterr().err


def test_data_problems_refuse_the_sweep_before_any_training(workdir, base_spec, capsys):
    path = write_sweep(workdir, base_spec, grid={"model.vocab_size": [300, 100]})  # 100 < the byte tokenizer's 257
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url]) == 2
    err = capsys.readouterr().err
    assert "problem(s) with the sweep's data; nothing was trained" in err
    assert "variant 1 (model.vocab_size=100), seed 0" in err and "variant 0" not in err
    assert Registry(url).runs() == [] and not (workdir / "runs").exists()


def test_report_by_name_keeps_the_sweeps_baseline(workdir, base_spec, capsys):
    path = write_sweep(workdir, base_spec, seeds=[0], baseline=1)
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--json"]) == 0
    by_file = json.loads(capsys.readouterr().out)
    assert main(["report", "mini", "--registry", url, "--json", "--out", str(workdir / "r")]) == 0
    by_name = json.loads(capsys.readouterr().out)
    assert by_name["baseline"] == by_file["baseline"] == 1
    assert by_name["rows"] == by_file["rows"]
    assert by_name["rows"][1]["verdict"] == "baseline"
    numbers = {v["index"]: v for v in by_name["variants"]}
    runs = {r.memberships["mini"].variant: r for r in Registry(url).runs(where="sweep = 'mini'")}
    assert numbers[0]["mean"] == runs[0].summary["val_loss"]
    assert numbers[0]["delta"] == pytest.approx(runs[0].summary["val_loss"] - runs[1].summary["val_loss"])
