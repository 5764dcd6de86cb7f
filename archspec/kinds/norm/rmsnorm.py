"""RMSNorm (Zhang & Sennrich, 2019): no mean subtraction, no bias."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, NormKind, lit_float, register


@register
class RMSNormSpec(NormKind):
    kind: Literal["rmsnorm"] = "rmsnorm"
    eps: float = Field(1e-5, gt=0, le=0.1)

    def params(self, d_model: int) -> int:
        return d_model

    def saved_elements(self, d_model: int) -> int:
        return 2 * d_model + 1  # decomposed: its input, rstd, and the normalised input (for the gain's gradient)

    def constants(self, m) -> list[Const]:
        return [Const("NORM_EPS", lit_float(self.eps))]

    def describe(self, m) -> str:
        return "RMSNorm"
