"""No channel mixer: the block is its token mixer alone, norm → mixer → residual (Mamba-2's block; Nemotron-H's
mixer-only layers). The block then holds no FFN and no FFN norm (FFNKind.sublayer), and the generated file no
FeedForward class for it. Only the pre-norm sequential block shape has a form without its second sublayer."""

from __future__ import annotations

from typing import ClassVar, Literal

from archspec.kinds.base import FFNKind, TPPlan, register


@register
class NoFFNSpec(FFNKind):
    kind: Literal["none"] = "none"
    prefix = "No"
    sublayer: ClassVar[bool] = False

    def params(self, d_model: int) -> int:
        return 0

    def flops(self, d_model: int) -> int:
        return 0

    def saved_elements(self, d_model: int) -> int:
        return 0

    def describe(self, m) -> str:
        return "no FFN"

    def tensor_parallel(self, m):
        return TPPlan()  # nothing to split

    def problems(self, m, path):
        if m.layer_problems():
            return []
        shapes = {b.block.label() or "pre" for b in m.blocks() if b.ffn is self and (
            b.block.norm_placement != "pre" or b.block.parallel)}
        if shapes:
            return [(path + ("kind",), "a block without a channel mixer is norm → mixer → residual: it needs the "
                     f"pre-norm sequential block (model.block: norm_placement pre, parallel false), got "
                     f"{', '.join(sorted(shapes))}", self.kind)]
        return []

    @classmethod
    def strategy(cls, ctx):
        return None  # the drawn models draw any block shape, which only the pre-norm block allows here: tested apart

    hf_block = "no_mlp"
