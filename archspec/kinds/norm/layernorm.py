"""LayerNorm (Ba et al., 2016), with or without its bias (GPT-2 has one)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.kinds.base import EPS_MIN, Const, NormKind, Split, TPPlan, lit_float, register
from archspec.kinds.hf import HFWeight, put_fact


@register
class LayerNormSpec(NormKind):
    kind: Literal["layernorm"] = "layernorm"
    prefix = "Layer"
    eps: float = Field(1e-5, ge=EPS_MIN, le=0.1)
    bias: bool = True  # GPT-2 LayerNorm has a bias; set false for the bias-free variant

    def tensor_parallel(self, m):
        """Sequence-parallel: each rank normalises its own positions, the gain replicated (its gradient summed)."""
        return TPPlan({"": Split("sequence")})

    def params(self, d_model: int) -> int:
        return d_model * (2 if self.bias else 1)

    def saved_elements(self, d_model: int) -> int:
        return d_model + 2  # native op: its input, the mean and rstd

    def constants(self, m) -> list[Const]:
        return [Const("NORM_EPS", lit_float(self.eps))]

    def describe(self, m) -> str:
        return "LayerNorm" if self.bias else "LayerNorm (no bias)"

    hf_block = "layer_norm"  # nn.LayerNorm

    @classmethod
    def from_hf(cls, cfg):
        return {"kind": "layernorm", "eps": cfg.take("norm_eps", float), "bias": cfg.fact("norm_bias")}

    def to_hf(self, m, out, hf, path):
        out[hf.keys["norm_eps"]] = self.eps
        put_fact(out, hf, "norm_bias", self.bias, (*path, "bias"))

    def hf_weights(self, m, hf):
        return [HFWeight("weight", ("weight",))] + ([HFWeight("bias", ("bias",))] if self.bias else [])
