"""RMSNorm (Zhang & Sennrich, 2019): no mean subtraction, no bias."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, NormKind, lit_float, register
from archspec.kinds.hf import HFWeight


@register
class RMSNormSpec(NormKind):
    kind: Literal["rmsnorm"] = "rmsnorm"
    prefix = "RMS"
    eps: float = Field(1e-5, gt=0, le=0.1)

    def params(self, d_model: int) -> int:
        return d_model

    def saved_elements(self, d_model: int) -> int:
        return 2 * d_model + 1  # decomposed: its input, rstd, and the normalised input (for the gain's gradient)

    def constants(self, m) -> list[Const]:
        return [Const("NORM_EPS", lit_float(self.eps))]

    def describe(self, m) -> str:
        return "RMSNorm"

    hf_block = "rms_norm"  # LlamaRMSNorm and its copies: x / sqrt(mean(x²) + eps) · weight, computed in fp32

    @classmethod
    def from_hf(cls, cfg):
        return {"kind": "rmsnorm", "eps": cfg.take("norm_eps", float)}

    def to_hf(self, m, out, hf, path):
        out[hf.keys["norm_eps"]] = self.eps

    def hf_weights(self, m, hf):
        return [HFWeight("weight", ("weight",))]
