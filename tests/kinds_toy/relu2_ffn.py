"""A toy FFN kind registered from outside archspec, through the public API only (tests/test_kinds.py).

Squared ReLU (So et al., 2021, "Primer"): down(relu(up(x))²), with an optional gain on the hidden units."""

from __future__ import annotations

from typing import Literal

import torch
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

    # metrics, through the same hooks as the built-in MoE's router statistics (archspec.kinds.base)
    metric_prefix = "relu2."
    metric_column = "active units"

    @classmethod
    def eval_stats(cls, model):
        active = [m.active for m in model.modules() if isinstance(getattr(m, "active", None), torch.Tensor)]
        return {"active": torch.stack(active).mean()} if active else {}

    @classmethod
    def eval_metrics(cls, stats):
        return {"relu2.active": float(stats["active"].reshape(()))} if "active" in stats else {}

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        return {"hidden_dim": st.integers(1, ctx["max_hidden"])}
