"""The ablation report shows the capability tasks' accuracy (mean over finished seeds; passkey per distance)."""

from __future__ import annotations

import pytest

from archspec.ablate.report import RunResult, VariantResult, table_rows, variant_numbers


def _variant(index: int, accuracies: list[dict[str, float]], status: str = "FINISHED") -> VariantResult:
    runs = [RunResult(f"r{index}{i}", i, status, 1.0 + i, 100.0, [(1, 1.0)], 64, summary={"val_loss": 1.0, **acc})
            for i, acc in enumerate(accuracies)]
    return VariantResult(index, f"v{index}", {}, 10, 10, 60, 8, runs)


def test_answer_accuracy_column_is_the_mean_over_seeds_with_distance_buckets():
    dense = _variant(0, [{"probe.accuracy": 0.9, "probe.accuracy.d8": 1.0, "probe.accuracy.d56": 0.8},
                         {"probe.accuracy": 0.7, "probe.accuracy.d8": 1.0, "probe.accuracy.d56": 0.4}])
    window = _variant(1, [{"probe.accuracy": 0.5, "probe.accuracy.d8": 1.0, "probe.accuracy.d56": 0.0}])
    failed = _variant(2, [{"probe.accuracy": 0.99}], status="FAILED")
    rows = table_rows([dense, window, failed], 0)
    assert rows[0]["answer acc"] == "0.800 (d8 1.00, d56 0.60)"
    assert rows[1]["answer acc"] == "0.500 (d8 1.00, d56 0.00)"
    assert rows[2]["answer acc"] == "-"  # a failed run's figures are not a result
    assert variant_numbers([dense, window], 0)[0]["probe"] == pytest.approx(
        {"probe.accuracy": 0.8, "probe.accuracy.d8": 1.0, "probe.accuracy.d56": 0.6})
    plain = _variant(3, [{}])
    assert "answer acc" not in table_rows([plain], 3)[0]  # text corpora: no column
