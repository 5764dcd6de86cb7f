"""What a run prints (issue 33): a progress line that keeps step, loss and ETA whole at any width down to 40 columns,
eval lines with the learning rate and gradient norm, and tokens/s figures that say what they average."""

from __future__ import annotations

import io
import json
import re

import pytest
import yaml
from rich.console import Console

from archspec.train.metrics import (
    RunMetrics,
    StepStats,
    average_rate_label,
    live_rate_label,
)
from archspec.train.progress import ProgressBar, clock, eval_line, progress_line

STATE = {"step": 275, "total": 1000, "loss": 3.21454, "rate": (23391.4, 20), "elapsed": 62.0, "remaining": 83.0}
ESSENTIALS = ("275/1000", "loss 3.2145", "ETA 0:01:23")


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_the_progress_line_fits_and_keeps_step_loss_and_eta(width):
    line = progress_line(width, **STATE).plain
    assert len(line) <= width
    for field in ESSENTIALS:
        assert field in line
    # Fields are left out whole, never cut: each shown one is there in full.
    if "tok/s" in line:
        assert "23,391 tok/s (last 20 steps)" in line
    if "elapsed" in line:
        assert "elapsed 0:01:02" in line


def test_lesser_fields_go_first_as_the_line_narrows():
    shown = {w: progress_line(w, **STATE).plain for w in (40, 60, 80, 120)}
    assert "tok/s" in shown[120] and "elapsed" in shown[120] and "━" in shown[120] and "train" in shown[120]
    assert "tok/s" not in shown[80] and "elapsed" in shown[80] and "━" in shown[80]
    assert "elapsed" not in shown[60] and "━" in shown[60]
    assert "━" not in shown[40]
    # The order holds at every width: a field is shown only if every one more important is.
    importance = ["━", "elapsed", "tok/s", "train"]
    for width in range(40, 200):
        line = progress_line(width, **STATE).plain
        present = [field in line for field in importance]
        assert present == sorted(present, reverse=True), (width, line)


def test_large_numbers_still_fit_40_columns():
    line = progress_line(40, step=100_000, total=100_000, loss=12.3456, rate=None, elapsed=None,
                         remaining=123_456.0).plain
    assert len(line) <= 40
    assert "100000/100000" in line and "loss 12.3456" in line and "ETA 34:17:36" in line


def test_before_anything_is_known():
    line = progress_line(80, step=0, total=100, loss=None, rate=None, elapsed=None, remaining=None).plain
    assert "0/100" in line and "loss -" in line and "ETA -:--:--" in line
    assert clock(3 * 86400 + 61) == "72:01:01"


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_the_bar_lays_out_at_the_width_of_columns(width, monkeypatch):
    """The run's progress display, at $COLUMNS (archspec.console's width logic) and through a console of fixed width."""
    monkeypatch.setenv("COLUMNS", str(width))
    for console in (None, Console(file=io.StringIO(), width=width)):
        bar = ProgressBar(True, total=1000, console=console)
        assert bar.console.width == width
        bar.start(274)
        bar.update(275, 3.21454, (23391.4, 20))
        line = bar.line().plain
        bar._progress.stop()
        # Just started: rich has no speed yet, so the ETA is not known (and says so).
        assert len(line) <= width and all(field in line for field in ("275/1000", "loss 3.2145", "ETA -:--:--")), line


def test_the_live_rate_is_the_recent_steady_rate():
    m = RunMetrics(tokens_per_step=1000, flops_per_token=1, palm_flops_per_token=None, peak_flops=1e12,
                   peak_source="test", world_size=1)
    assert m.live_rate() is None
    m.step(StepStats(3.0, {}, 1.0, 1e-3, seconds=1.0))  # the first step: warm-up, slow
    assert m.live_rate() == (1000.0, 1)
    for _ in range(30):
        m.step(StepStats(3.0, {}, 1.0, 1e-3, seconds=0.1))
    rate, steps = m.live_rate()
    assert steps == 20 and rate == pytest.approx(10_000)
    assert m.throughput()["tokens_per_s"] == pytest.approx(10_000)  # the first step left out of both
    assert m.steady_steps() == 30
    assert live_rate_label(1) == "tok/s (last step)" and live_rate_label(20) == "tok/s (last 20 steps)"
    assert average_rate_label(2, 31) == "tok/s avg (steps 2–31)" and average_rate_label(1, 1) == "tok/s avg (step 1)"


def test_the_eval_line_says_lr_and_grad_norm_and_of_which_steps():
    m = RunMetrics(tokens_per_step=1, flops_per_token=1, palm_flops_per_token=None, peak_flops=1.0,
                   peak_source="test", world_size=1)
    for step, (norm, lr) in enumerate([(1.0, 1e-3), (3.0, 2e-3), (2.0, 3e-3)], start=1):
        m.step(StepStats(3.0, {}, norm, lr, seconds=0.1))
    val = {"val_loss": 4.5, "val_ppl": 90.0171}
    line = eval_line(3, 100, val, m.since_eval(3))
    assert line == ("step   3/100 · val loss 4.5000 · ppl 90.02 · lr 3.00e-03 (step 3) · grad norm 2 mean, 3 max "
                    "(steps 1–3)")
    m.step(StepStats(3.0, {}, 0.5, 4e-3, seconds=0.1))
    assert eval_line(4, 100, val, m.since_eval(4)).endswith("lr 4.00e-03 (step 4) · grad norm 0.5 mean, 0.5 max (step 4)")
    # No step since the last evaluation (a run resumed at its end): nothing to say of training.
    assert eval_line(4, 100, val, m.since_eval(4)) == "step   4/100 · val loss 4.5000 · ppl 90.02"


def test_a_real_run_prints_lr_grad_norm_and_labelled_rates(corpus_dir, tmp_path, capsys, monkeypatch):
    from archspec.cli import main

    from .conftest import tiny_spec_dict

    monkeypatch.setenv("COLUMNS", "60")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict(corpus_dir)))
    assert main(["train", str(spec), "--device", "cpu", "--run-dir", str(tmp_path / "run"), "--json"]) == 0
    out, err = capsys.readouterr()
    evals = [line for line in err.splitlines() if "val loss" in line and line.lstrip().startswith("step")]
    assert len(evals) == 2, err
    assert re.search(r"step 4/8 · val loss \d+\.\d{4} · ppl [\d.]+ · lr \d\.\d\de-\d\d \(step 4\) · "
                     r"grad norm [\d.]+ mean, [\d.]+ max \(steps 1–4\)", evals[0]), evals[0]
    assert "(steps 5–8)" in evals[1]
    closing = next(line for line in err.splitlines() if line.startswith("FINISHED"))
    assert re.search(r"[\d,]+ tok/s avg \(steps 2–8\) · MFU", closing), closing
    # --json keeps its keys: tokens_per_s is the same average, unlabelled.
    result = json.loads(out)
    assert f"{result['tokens_per_s']:,.0f} tok/s avg" in closing
    assert "grad_norm" not in result and "lr" not in result
