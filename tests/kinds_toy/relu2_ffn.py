"""A toy FFN kind registered from outside archspec, through the public API only (tests/test_kinds.py).

Squared ReLU (So et al., 2021, "Primer"): down(relu(up(x))²), with an optional gain on the hidden units."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.kinds import Const, FFNKind, lit_float, lit_int, register


@register
class SquaredReLUSpec(FFNKind):
    kind: Literal["relu2"] = "relu2"
    hidden_dim: int = Field(64, ge=1, le=4096)
    gain: float = Field(1.0, gt=0, le=100.0)

    def params(self, d_model: int) -> int:
        return 2 * d_model * self.hidden_dim + 1  # up, down, and the learned gain

    def flops(self, d_model: int) -> int:
        return 2 * 2 * d_model * self.hidden_dim

    def constants(self, m) -> list[Const]:
        return [Const("RELU2_HIDDEN", lit_int(self.hidden_dim)), Const("RELU2_GAIN", lit_float(self.gain))]

    def describe(self, m) -> str:
        return f"squared-ReLU FFN (hidden {self.hidden_dim})"

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        return {"hidden_dim": st.integers(1, ctx["max_hidden"])}
