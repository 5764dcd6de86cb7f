"""Rotary position embedding (Su et al., 2021), as in LLaMA ("rotate half" layout)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, PositionalKind, lit_float, register


@register
class RopePositional(PositionalKind):
    kind: Literal["rope"] = "rope"  # rotary embeddings applied to q and k in every layer (RoFormer, LLaMA)
    theta: float = Field(10000.0, gt=1.0, le=1e9)

    head_dim_multiple = 2  # rotates pairs of dimensions

    def problems(self, m, path):
        hd = m.attention.head_dim
        if hd is not None and hd % 2:
            return [(("model", "attention", "head_dim"), f"must be even for rope (rotates pairs), got {hd}", hd)]
        odd = sorted({a.head_dim for a in m.attentions() if a.head_dim is not None and a.head_dim % 2})
        if odd:  # a layer group's head_dim
            return [(("model", "layers"), f"head_dim must be even for rope (rotates pairs), got {odd[0]}", odd[0])]
        return []

    def constants(self, m) -> list[Const]:
        return [Const("ROPE_THETA", lit_float(self.theta), "base of the rotary frequencies")]

    def describe(self, m) -> str:
        return "rotary positions"

    def saved_elements(self, m) -> int:
        a = m.attention
        return (a.n_heads + a.n_kv_heads) * a.head_dim  # the rotated q and k (new tensors; v stays a view)

    def buffer_elements(self, m) -> int:
        return 2 * m.context_length * m.attention.head_dim  # cos and sin tables
