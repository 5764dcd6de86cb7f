"""RMSNorm (Zhang & Sennrich, 2019): no mean subtraction, no bias."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from archspec.kinds.base import EPS_MIN, Const, NormKind, Since, Split, TPPlan, lit_float, register
from archspec.kinds.hf import HFWeight, put_fact


@register
class RMSNormSpec(NormKind):
    kind: Literal["rmsnorm"] = "rmsnorm"
    prefix = "RMS"
    eps: float = Field(1e-5, ge=EPS_MIN, le=0.1)
    # Gemma: the gain is stored as w, initialised to 0, and applied as (1 + w); the same function at init as the
    # plain gain at 1, but weight decay pulls it towards the identity rather than towards zero.
    unit_offset: Annotated[bool, Since("0.4")] = False

    def tensor_parallel(self, m):
        """Sequence-parallel: each rank normalises its own positions, the gain replicated (its gradient summed)."""
        return TPPlan({"": Split("sequence")})

    def params(self, d_model: int) -> int:
        return d_model

    def saved_elements(self, d_model: int) -> int:
        return 2 * d_model + 1  # decomposed: its input, rstd, and the normalised input (for the gain's gradient)

    def constants(self, m) -> list[Const]:
        return [Const("NORM_EPS", lit_float(self.eps))]

    def describe(self, m) -> str:
        return "RMSNorm (1 + w)" if self.unit_offset else "RMSNorm"

    def template_context(self, m):
        return {"unit_offset": self.unit_offset}

    hf_block = "rms_norm"  # LlamaRMSNorm and its copies: x / sqrt(mean(x²) + eps) · weight, computed in fp32

    @classmethod
    def from_hf(cls, cfg):
        out = {"kind": "rmsnorm", "eps": cfg.take("norm_eps", float)}
        if cfg.fact("norm_unit_offset"):  # Gemma's (1 + w): a fact of the model type
            out["unit_offset"] = True
        return out

    def to_hf(self, m, out, hf, path):
        out[hf.keys["norm_eps"]] = self.eps
        put_fact(out, hf, "norm_unit_offset", self.unit_offset, (*path, "unit_offset"))

    def hf_weights(self, m, hf):
        return [HFWeight("weight", ("weight",))]
