"""No positional encoding (NoPE): the causal mask alone carries position (Kazemnejad et al., 2023)."""

from __future__ import annotations

from typing import Literal

from archspec.kinds.base import PositionalKind, TPPlan, register


@register
class NoPositional(PositionalKind):
    kind: Literal["none"] = "none"  # NoPE: causal masking alone carries position
    relative = True  # nothing absolute: a windowed NoPE model can run past its context
    inert = True  # what a layer group writes to switch positions off for its layers (SmolLM3's NoPE layers)
    prefix = "NoPE"  # such a layer's attention class: NoPEAttention

    def tensor_parallel(self, m):
        """No positions: nothing to split."""
        return TPPlan()

    def describe(self, m) -> str:
        return "no positional encoding (NoPE)"
