"""MLP: down(act(up(x))), as in GPT-2 (GELU at 4·d_model)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, FFNKind, lit_bool, lit_int, register
from archspec.kinds.ffn.activations import KEEPS_OUTPUT, MLP_NAMES, MLPActivation, call
from archspec.kinds.limits import MAX_HIDDEN


@register
class MLPSpec(FFNKind):
    kind: Literal["mlp"] = "mlp"  # up → activation → down
    activation: MLPActivation = "gelu"
    hidden_dim: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="default 4 · d_model")
    bias: bool = True

    def fill_defaults(self, m) -> None:
        if self.hidden_dim is None:
            object.__setattr__(self, "hidden_dim", min(MAX_HIDDEN, 4 * m.d_model))

    def params(self, d_model: int) -> int:
        return 2 * d_model * self.hidden_dim + ((self.hidden_dim + d_model) if self.bias else 0)

    def flops(self, d_model: int) -> int:
        return 2 * 2 * d_model * self.hidden_dim

    def saved_elements(self, d_model: int) -> int:
        return (1 if self.activation in KEEPS_OUTPUT else 2) * self.hidden_dim  # up's output, act's output

    def constants(self, m) -> list[Const]:
        return [Const("FFN_HIDDEN", lit_int(self.hidden_dim), f"{self.hidden_dim / m.d_model:.3g} × D_MODEL"),
                Const("FFN_BIAS", lit_bool(self.bias))]

    def describe(self, m) -> str:
        return f"{MLP_NAMES[self.activation]} MLP FFN (hidden {self.hidden_dim})"

    def template_context(self, m):
        return {"act_up": call(self.activation, "self.up_proj(x)"), "activation_name": self.activation}

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        return {"hidden_dim": st.integers(1, ctx["max_hidden"])}
