"""Figures a reader would misread: tok/s compared only between runs measured under alike load, and ETAs that count
the evaluations still to come (the run's and the sweep's)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from archspec.ablate.report import RunResult, VariantResult, load_differed, table_rows
from archspec.train.progress import ProgressBar, SweepPosition, progress_line


def variant(index, loads, rate=1000.0):
    runs = [RunResult(f"r{index}{i}", i, "FINISHED", 3.0, rate, [(10, 3.0)], 256,
                      {"val_loss": 3.0, **({"load_average": load} if load is not None else {})})
            for i, load in enumerate(loads)]
    return VariantResult(index, f"v{index}", {}, 100, 100, 600, 512, runs)


def test_tok_s_is_flagged_when_the_load_differed(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)  # tolerance: one core's worth
    alike = [variant(0, [2.0, 2.4]), variant(1, [2.2, 2.9])]
    assert load_differed(alike) is None
    assert all("differed" not in row["tok/s"] for row in table_rows(alike, 0))
    busy = [variant(0, [0.5, 0.6]), variant(1, [4.8, 5.2])]
    assert "0.5 to 5.2" in load_differed(busy)
    rows = table_rows(busy, 0)
    assert "load 0.6: differed" in rows[0]["tok/s"] and "load 5.0: differed" in rows[1]["tok/s"]
    # runs recorded before the load was: not judged
    assert load_differed([variant(0, [None]), variant(1, [9.0])]) is None


@given(total=st.integers(1, 500), every=st.integers(1, 100), step=st.integers(0, 500),
       tokens_per_step=st.integers(1, 4096), eval_tokens=st.integers(1, 1 << 16), rate=st.floats(1.0, 1e7))
def test_the_eta_counts_the_evaluations_left(total, every, step, tokens_per_step, eval_tokens, rate):
    step = min(step, total)
    bar = ProgressBar(False, total)
    bar.plan(tokens_per_step, eval_tokens, every)
    remaining = bar.remaining(step, (rate, 1))
    step_s = tokens_per_step / rate
    evals_left = sum(1 for s in range(step + 1, total + 1) if s % every == 0 or s == total)
    expected = (total - step) * step_s + evals_left * eval_tokens * step_s / (3 * tokens_per_step)
    assert abs(remaining - expected) <= 1e-9 * max(1.0, expected)
    bar.evaluated(7.0)  # measured: the evaluations left at the measured time from here on
    assert abs(bar.remaining(step, (rate, 1)) - ((total - step) * step_s + evals_left * 7.0)) <= 1e-6 * max(1, expected)


def test_a_sweep_run_says_when_the_sweep_ends():
    line = progress_line(200, step=5, total=10, loss=2.0, rate=(100.0, 5), elapsed=10.0, remaining=60.0,
                         description="sweep ffn 2/4", sweep_remaining=120.0).plain
    assert "sweep ffn 2/4" in line and "ETA 0:01:00 (sweep 0:03:00)" in line
    assert ProgressBar(False, 10, sweep=SweepPosition("sweep ffn 2/4", None)).description == "sweep ffn 2/4"
    assert SweepPosition("x", None)  # truthy: the loop shows progress for it


def test_runs_compare_says_when_the_load_differed(tmp_path, capsys, monkeypatch):
    from archspec.cli import main
    from archspec.registry import Registry
    from tests.registry.helpers import make_info, make_spec, record_run

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with Registry(url) as reg:
        quiet = record_run(reg, make_info(make_spec("a")), summary={"tokens_per_s": 250.0, "load_average": 0.4})
        busy = record_run(reg, make_info(make_spec("b"), seed=1), summary={"tokens_per_s": 120.0, "load_average": 6.0})
        alike = record_run(reg, make_info(make_spec("c"), seed=2), summary={"tokens_per_s": 240.0, "load_average": 0.9})
    assert main(["runs", "compare", quiet, busy, "--registry", url]) == 0
    assert "load differed" in capsys.readouterr().err
    assert main(["runs", "compare", quiet, alike, "--registry", url]) == 0
    assert "load differed" not in capsys.readouterr().err


def test_a_sweep_estimates_each_job_for_its_eta(tmp_path):
    from pathlib import Path

    from archspec.ablate.runner import job_seconds
    from archspec.ablate.sweep import load_sweep
    from archspec.registry import Registry

    ffn = Path(__file__).resolve().parents[2] / "specs" / "ablations" / "ffn.yaml"
    sweep = load_sweep(ffn, steps=4, seeds=[0, 1])
    seconds = job_seconds(sweep.jobs, Registry(f"sqlite:///{tmp_path / 'none.db'}"), "cpu", tmp_path / "cache")
    assert set(seconds) == {j.key for j in sweep.jobs} and all(s and s > 0 for s in seconds.values())
    assert not (tmp_path / "none.db").exists()  # estimating reads the registry, never creates it
