"""Dense causal attention: every query sees itself and every earlier key."""

from __future__ import annotations

from typing import Literal

from archspec.kinds.base import SparsityKind, TPPlan, register


@register
class DenseSparsity(SparsityKind):
    kind: Literal["dense"] = "dense"  # full causal attention

    def tensor_parallel(self, m):
        """Heads attend independently: a rank's heads see the same keys as on one process; nothing to split."""
        return TPPlan()

    def keys(self, seq_len: int) -> float:
        return (seq_len + 1) / 2  # query t sees t + 1 keys; the mean over t = 0..T-1

    def describe(self, m) -> str:
        return "dense causal attention"

    hf_block = "full_attention"  # transformers' word for it in `layer_types`
