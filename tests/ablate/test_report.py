"""The verdict arithmetic: mean ± std over seeds, Δ vs baseline, and the pooled-standard-error noise flag."""

from __future__ import annotations

import math
import statistics

import pytest

from archspec.ablate.report import RunResult, VariantResult, compare, pooled_se, table_rows


def variant(index, finals, *, kv=512, moe=None):
    runs = [RunResult(f"r{index}{i}", i, "FINISHED", x, 1000.0, [(10, x + 1), (20, x)], 256,
                      {"val_loss": x, **({"moe.load_cv": moe} if moe is not None else {})})
            for i, x in enumerate(finals)]
    return VariantResult(index, f"v{index}", {}, 100, 100, 600, kv, runs)


def test_pooled_se_formula():
    a, b = [1.0, 1.2, 1.1], [2.0, 2.4]
    sp2 = (2 * statistics.variance(a) + 1 * statistics.variance(b)) / 3
    assert pooled_se(a, b) == pytest.approx(math.sqrt(sp2) * math.sqrt(1 / 3 + 1 / 2))
    assert pooled_se([1.0], [2.0]) is None  # no estimate of noise from one seed each


def test_within_noise_flag_uses_two_pooled_standard_errors():
    base = variant(0, [3.00, 3.10, 3.05])
    near = variant(1, [3.02, 3.12, 3.07])  # Δ = 0.02, SE ≈ 0.041: within noise
    far = variant(2, [2.50, 2.52, 2.51])  # Δ = -0.54: better
    worse = variant(3, [3.60, 3.62, 3.61])
    assert compare(near, base).verdict == "within noise"
    assert compare(far, base).verdict == "better"
    assert compare(worse, base).verdict == "worse"
    assert compare(variant(4, [3.0]), variant(5, [3.1])).verdict == "n/a (1 seed)"
    c = compare(near, base)
    assert c.delta == pytest.approx(0.02) and abs(c.delta) < 2 * c.se


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
