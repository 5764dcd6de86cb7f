"""The verdict arithmetic: mean ± std over seeds, Δ vs baseline with its Welch t interval, and the verdict."""

from __future__ import annotations

import math

import pytest

from archspec.ablate.report import RunResult, VariantResult, compare, table_rows, variant_numbers
from archspec.ablate.stats import combination, mean_interval, verdict, welch


def variant(index, finals, *, kv=512, moe=None):
    runs = [RunResult(f"r{index}{i}", i, "FINISHED", x, 1000.0, [(10, x + 1), (20, x)], 256,
                      {"val_loss": x, **({"moe.load_cv": moe} if moe is not None else {})})
            for i, x in enumerate(finals)]
    return VariantResult(index, f"v{index}", {}, 100, 100, 600, kv, runs)


def test_welch_interval_by_hand():
    # a = [1, 2, 3], b = [2, 3, 4]: Δ = -1, s² = 1 on both sides, SE = sqrt(1/3 + 1/3) = 0.816497,
    # Welch–Satterthwaite ν = (2/3)² / ((1/3)²/2 · 2) = 4; t(0.975, 4) = 2.776445 (any t table).
    ci = welch([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert ci.estimate == pytest.approx(-1.0)
    assert ci.se == pytest.approx(0.816497, abs=1e-6)
    assert ci.dof == pytest.approx(4.0)
    assert (ci.low, ci.high) == (pytest.approx(-1 - 2.776445 * 0.816497, abs=1e-5),
                                 pytest.approx(-1 + 2.776445 * 0.816497, abs=1e-5))
    assert verdict(ci) == "inconclusive"
    # unequal variances and sizes: a = [0, 2] (s² = 2), b = [0, 0, 3, 3] (s² = 3): SE² = 2/2 + 3/4 = 1.75,
    # ν = 1.75² / (1²/1 + 0.75²/3) = 3.0625 / 1.1875 = 2.578947
    ci = welch([0.0, 2.0], [0.0, 0.0, 3.0, 3.0])
    assert ci.estimate == pytest.approx(-0.5) and ci.se == pytest.approx(math.sqrt(1.75))
    assert ci.dof == pytest.approx(3.0625 / 1.1875)


@pytest.mark.parametrize("a, b", [([1.0, 1.2, 1.1], [2.0, 2.4]), ([3.00, 3.10, 3.05], [3.02, 3.12, 3.07, 2.9]),
                                  ([0.0, 2.0], [0.0, 0.0, 3.0, 3.0]), ([2.17, 2.18, 2.21], [2.51, 2.53, 2.49])])
def test_welch_interval_matches_scipy(a, b):
    stats = pytest.importorskip("scipy.stats")
    res = stats.ttest_ind(a, b, equal_var=False)
    low, high = res.confidence_interval(0.95)
    ci = welch(a, b)
    assert (ci.low, ci.high) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
    assert ci.dof == pytest.approx(res.df, rel=1e-9)
    assert ci.estimate / ci.se == pytest.approx(res.statistic, rel=1e-9)
    # the one-group interval is scipy's one-sample t interval
    low1, high1 = stats.ttest_1samp(a, 0.0).confidence_interval(0.95)
    m = mean_interval(a)
    assert (m.low, m.high) == (pytest.approx(low1, rel=1e-9), pytest.approx(high1, rel=1e-9))


def test_combination_generalises_welch():
    a, b = [1.0, 1.3, 1.1], [2.0, 2.4, 2.2, 2.1]
    assert combination([(1.0, a), (-1.0, b)]) == welch(a, b)
    assert combination([(1.0, [1.0])]).known is False  # one value: no variance, no interval
    assert combination([(1.0, a), (1.0, [])]) is None


def test_verdict_only_when_the_interval_excludes_zero():
    base = variant(0, [3.00, 3.10, 3.05])
    near = variant(1, [3.02, 3.12, 3.07])  # Δ = 0.02, interval ≈ [-0.11, +0.15]: inconclusive
    far = variant(2, [2.50, 2.52, 2.51])  # Δ = -0.54: better
    worse = variant(3, [3.60, 3.62, 3.61])
    assert compare(near, base).verdict == "inconclusive"
    assert compare(far, base).verdict == "better"
    assert compare(worse, base).verdict == "worse"
    assert compare(variant(4, [3.0]), variant(5, [3.1, 3.2])).verdict == "n/a (1 seed)"
    c = compare(near, base)
    assert c.delta == pytest.approx(0.02) and c.interval.low < 0 < c.interval.high
    # a difference twice the pooled SE (the old "noise" flag's threshold) at n = 3 is not enough for 95%
    edge = variant(6, [3.05 + 0.05 * 2.05 * math.sqrt(2 / 3) + d for d in (-0.05, 0.05, 0.0)])
    assert compare(edge, base).verdict == "inconclusive"


def test_rows_and_json_show_the_interval():
    base, other = variant(0, [3.00, 3.10, 3.05]), variant(1, [2.50, 2.52, 2.51])
    rows = table_rows([base, other], 0)
    ci = welch(other.finals, base.finals)
    assert rows[1]["95% CI"] == f"[{ci.low:+.4f}, {ci.high:+.4f}]" and rows[0]["95% CI"] == "-"
    nums = variant_numbers([base, other], 0)
    assert nums[1]["ci_low"] == ci.low and nums[1]["ci_high"] == ci.high and nums[1]["dof"] == ci.dof
    assert nums[1]["verdict"] == "better" and nums[1]["ci_level"] == 0.95 and nums[0]["ci_low"] is None


def test_failed_runs_do_not_count_and_rows_render():
    base = variant(0, [3.0, 3.2])
    other = variant(1, [2.0, 2.1])
    other.runs[1].status = "FAILED"
    assert other.finals == [2.0]
    rows = table_rows([base, other], 0)
    assert rows[0]["val loss"] == "3.1000 ± 0.1414 (n=2)" and rows[0]["verdict"] == "baseline"
    assert rows[1]["val loss"] == "2.0000 (n=1)" and rows[1]["Δ vs baseline"] == "-1.1000"  # no std from one seed
    assert "KV B/tok" not in rows[0]  # equal everywhere: not shown


def test_kind_specific_columns_appear_only_when_some_variant_has_them():
    rows = table_rows([variant(0, [3.0, 3.1], kv=512), variant(1, [3.0, 3.1], kv=128, moe=0.25)], 0)
    assert rows[0]["KV B/tok"] == "512" and rows[1]["KV B/tok"] == "128"
    assert rows[1]["load stats"] == "load_cv=0.25" and rows[0]["load stats"] == "-"
