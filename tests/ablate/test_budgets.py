"""Evaluation follows the training budget (docs/budgets.md): the rule, `--steps` rescaling a spec's interval,
`--eval-tokens`, the dry run's evaluation share, and none of it moving a run's identity."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.ablate.estimate import work_of
from archspec.ablate.sweep import load_sweep
from archspec.cli import main
from archspec.cli.train import observation_overrides
from archspec.spec import load_spec, model_hash
from archspec.spec.train import (
    EVAL_POINTS,
    EVAL_SHARE,
    EVAL_TOKENS_CAP,
    EVAL_TOKENS_FLOOR,
    MIN_EVAL_POINTS,
    rescaled_interval,
    resolved_eval,
)
from archspec.train.logger import run_key

ROOT = Path(__file__).resolve().parents[2]
FFN = ROOT / "specs" / "ablations" / "ffn.yaml"
TINY = ROOT / "specs" / "llama-like-tiny.yaml"


@settings(max_examples=200, deadline=None)
@given(steps=st.integers(1, 1_000_000), tokens_per_step=st.integers(1, 1 << 20))
def test_the_rule_bounds_size_points_and_share(steps, tokens_per_step):
    every, size = resolved_eval(steps, tokens_per_step, None, None)
    assert EVAL_TOKENS_FLOOR <= size <= EVAL_TOKENS_CAP
    evals = steps // every + (1 if steps % every else 0)
    assert min(steps, MIN_EVAL_POINTS) / 2 <= evals <= EVAL_POINTS
    train_tokens = steps * tokens_per_step
    if train_tokens * EVAL_SHARE >= MIN_EVAL_POINTS * EVAL_TOKENS_FLOOR:  # the run affords the floor-sized points:
        assert evals * size <= EVAL_SHARE * train_tokens + size  # its evaluations read at most the share (+ one)
    if size == EVAL_TOKENS_CAP and steps >= EVAL_POINTS * 10:
        assert evals == EVAL_POINTS  # a long run keeps its ten points


@given(steps=st.integers(1, 100_000), tokens_per_step=st.integers(1, 1 << 16), interval=st.integers(1, 1000),
       size=st.integers(1, 1 << 20))
def test_what_a_recipe_states_wins(steps, tokens_per_step, interval, size):
    assert resolved_eval(steps, tokens_per_step, interval, size) == (interval, size)
    assert resolved_eval(steps, tokens_per_step, None, size)[1] == size


@given(spec_steps=st.integers(1, 100_000), interval=st.integers(1, 10_000), steps=st.integers(1, 100_000))
def test_rescaling_keeps_the_number_of_points(spec_steps, interval, steps):
    points = -(-spec_steps // interval)
    got = -(-steps // rescaled_interval(interval, spec_steps, steps))
    assert min(points, steps) / 2 <= got <= points


def test_short_train_steps_keeps_the_presets_points():
    # llama-like-tiny: 100 steps, eval_interval 25 = four points; --steps 20 keeps four, not one
    extra = observation_overrides(str(TINY), (), 20, None)
    assert extra == ("train.eval_interval=5",)
    # an interval the user gives is kept, and --eval-tokens is train.eval_tokens
    assert observation_overrides(str(TINY), ("train.eval_interval=7",), 20, 4096) == ("train.eval_tokens=4096",)
    assert observation_overrides(str(TINY), (), None, None) == ()


def test_observation_never_moves_identity():
    spec = load_spec(TINY)
    other = load_spec(TINY, ["train.eval_interval=5", "train.eval_tokens=4096"])
    assert model_hash(spec) == model_hash(other)
    a, b = spec.train.model_dump(mode="json"), other.train.model_dump(mode="json")
    assert run_key(model_hash(spec), a, "d", 0) == run_key(model_hash(other), b, "d", 0)


def test_a_short_sweep_evaluates_a_bounded_share():
    sweep = load_sweep(FFN, steps=60, seeds=[0, 1])
    sizes = {v.spec.train.eval_tokens for v in sweep.variants}
    assert sizes == {EVAL_TOKENS_FLOOR}  # one validation set for every variant, at the floor for 61k tokens
    for v in sweep.variants:
        work = work_of(v.spec, v.accounting)
        assert work.evals == MIN_EVAL_POINTS
        assert work.eval_flop_share < 0.3  # was 0.78 with ten evaluations of 65,536 tokens
    # the file's own budget (400k tokens) affords ten points of half its tokens
    full = load_sweep(FFN)
    t = full.variants[0].spec.train
    assert work_of(full.variants[0].spec, full.variants[0].accounting).evals == EVAL_POINTS
    assert EVAL_TOKENS_FLOOR < t.eval_tokens < EVAL_TOKENS_CAP
    # the run keys of the sweep are those without the rule: eval size and cadence are not identity
    explicit = load_sweep(FFN, steps=60, seeds=[0, 1], overrides=["train.eval_tokens=65536"])
    assert [j.key for j in explicit.jobs] == [j.key for j in sweep.jobs]


def test_eval_tokens_option_and_dry_run_share(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    argv = ["ablate", str(FFN), "--steps", "60", "--seeds", "0,1", "--dry-run", "--registry", url, "--device", "cpu"]
    assert main([*argv, "--eval-tokens", "4096"]) == 0
    out = capsys.readouterr().out
    assert "10 × 4.10k" in out and "of it evaluation)" in out and "eval share" in out
    assert main([*argv, "--eval-tokens", "0"]) == 2
    assert "--eval-tokens" in capsys.readouterr().err
