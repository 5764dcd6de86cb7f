"""ALiBi (Press et al., 2022, "Train Short, Test Long"): no position table and no rotation; each head adds
slope_h · (key position − query position) to its attention scores, so a key's weight decays linearly with its
distance, faster on heads with larger slopes. The slopes are BLOOM's and MPT's (`build_alibi_tensor`,
`build_alibi_bias` with alibi_bias_max 8): for the largest power of two n ≤ N_HEADS, 2^(−8i/n) for i = 1..n; the
other heads take the odd-numbered slopes of 2n heads' sequence, 2^(−8i/2n) for i = 1, 3, 5, ...

The bias reaches the attention kernels as `alibi=alibi` (the slopes; `score_args`), which every path applies from
absolute positions (archspec.runtime.scores, the sparse tiles, FlexAttention's score_mod, the rolling cache's slots),
so a cached decode equals the full forward. Offsets only: like rope, a windowed ALiBi model generates past
context_length (`relative`); with a dense layer, context_length stays the longest sequence (nothing is sized by it:
it is the length the model was trained at, and ALiBi's extrapolation beyond it is the paper's claim, not checked)."""

from __future__ import annotations

from typing import Literal

from archspec.kinds.base import PositionalKind, TPPlan, register


@register
class AlibiPositional(PositionalKind):
    kind: Literal["alibi"] = "alibi"  # a per-head linear bias on the attention scores (BLOOM, MPT)
    relative = True  # the bias depends on the offset alone
    score_args = ", alibi=alibi"
    in_attention = True  # a layer group may switch it off (its layers then take no bias)
    per_head = True  # the slopes of the module's own heads: its `heads` slice

    def tensor_parallel(self, m):
        """Slopes are computed, not stored: each rank takes its own heads' (the attention kind's plan narrows `heads`)."""
        return TPPlan()

    def describe(self, m) -> str:
        return "ALiBi attention biases"

    def problems(self, m, path):
        layers = [b.attention for b in m.blocks()] if not m.layer_problems() else [m.attention]
        for att in layers:
            if not getattr(type(att), "takes_score_mods", False):
                return [((*path, "kind"), f"alibi adds a bias to the attention scores, which attention kind "
                         f"{att.kind!r} cannot take; use rope, learned, sinusoidal or none with it", "alibi")]
        return []

    hf_block = "alibi"  # transformers' BLOOM, MPT and Falcon (alibi: true) build the same slopes
