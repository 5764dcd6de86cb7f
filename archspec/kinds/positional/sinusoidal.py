"""Fixed sinusoidal positions (Vaswani et al., 2017), added to the token embeddings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, PositionalKind, lit_float, register


@register
class SinusoidalPositional(PositionalKind):
    kind: Literal["sinusoidal"] = "sinusoidal"  # fixed table from "Attention Is All You Need", added to embeddings
    base: float = Field(10000.0, gt=1.0, le=1e9)
    # The paper also multiplies token embeddings by sqrt(d_model) before adding the table; that is the model option
    # `model.embedding_scale: sqrt_d_model`, not this kind's: without it, N(0, 0.02) embeddings are swamped by the
    # table's unit-amplitude sinusoids (measured: docs/ABLATIONS.md).

    def problems(self, m, path):
        if m.d_model % 2:
            return [(("model", "d_model"), f"must be even for sinusoidal positions, got {m.d_model}", m.d_model)]
        return []

    def constants(self, m) -> list[Const]:
        return [Const("SINUSOID_BASE", lit_float(self.base))]

    def describe(self, m) -> str:
        return "sinusoidal positions"

    def buffer_elements(self, m) -> int:
        return m.context_length * m.d_model

    @classmethod
    def strategy(cls, ctx):
        return super().strategy(ctx) if ctx["d_model"] % 2 == 0 else None  # sin/cos pairs need an even width
