"""Learned absolute positions (GPT-2): a trained table added to the token embeddings."""

from __future__ import annotations

from typing import Literal

from archspec.kinds.base import PositionalKind, register


@register
class LearnedPositional(PositionalKind):
    kind: Literal["learned"] = "learned"  # a trained (context_length, d_model) table, as in GPT-2

    def params(self, m) -> int:
        return m.context_length * m.d_model

    def describe(self, m) -> str:
        return "learned positions"
