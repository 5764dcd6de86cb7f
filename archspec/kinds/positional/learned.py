"""Learned absolute positions (GPT-2): a trained table added to the token embeddings."""

from __future__ import annotations

from typing import Literal

from archspec.kinds.base import Divides, PositionalKind, Split, TPPlan, register
from archspec.kinds.hf import HFWeight


@register
class LearnedPositional(PositionalKind):
    kind: Literal["learned"] = "learned"  # a trained (context_length, d_model) table, as in GPT-2

    def tensor_parallel(self, m):
        """Names inside the Model (its `positions` module): the sequence gathered around it (each rank adds the table
        to the whole sequence, then keeps its shard), the table split by features and all-gathered."""
        return TPPlan({"positions": Split("around"), "positions.pos_emb": Split("colwise", replicated_output=True)},
                      divides=(Divides(("model", "d_model"), m.d_model, "d_model"),))

    def params(self, m) -> int:
        return m.context_length * m.d_model

    def describe(self, m) -> str:
        return "learned positions"

    hf_block = "absolute"  # a trained position table (GPT-2's wpe)

    def hf_weights(self, m, hf):
        # model-level: inside the base model, beside the token embeddings
        return [HFWeight("positions.pos_emb.weight", (f"{hf.names['positions']}.weight",))]
