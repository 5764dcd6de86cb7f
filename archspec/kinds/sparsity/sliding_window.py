"""Sliding-window attention (Longformer's local attention; Mistral): each query sees the last `window` positions."""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, SparsityKind, TPPlan, lit_int, register
from archspec.kinds.limits import MAX_CONTEXT
from archspec.kinds.sparsity.blockwise import blockwise_saved_bytes, chunk_for


def window_keys(seq_len: int, window: int) -> int:
    """Σ over queries t = 0..T-1 of min(t + 1, window): the keys a causal window of `window` positions holds."""
    m = min(seq_len, window)
    return m * (m + 1) // 2 + (seq_len - m) * window


@register
class SlidingWindowSparsity(SparsityKind):
    kind: Literal["sliding_window"] = "sliding_window"  # query i sees keys j with i - window < j <= i
    prefix = "Window"
    cache_class = "RollingKVCache"
    window: int = Field(256, ge=1, le=MAX_CONTEXT,
                        description="positions each query sees, itself included (HF Mistral's sliding_window)")


    def tensor_parallel(self, m):
        """Heads attend independently: a rank's heads see the same keys as on one process; nothing to split."""
        return TPPlan()

    def keys(self, seq_len: int) -> Fraction:
        return Fraction(window_keys(seq_len, self.window), seq_len)

    def cached_positions(self, context_length: int) -> int:
        return min(self.window, context_length)  # a rolling buffer of the window

    def max_lookback(self) -> int:
        return self.window

    def constants(self, m) -> list[Const]:
        return [Const("WINDOW", lit_int(self.window), "query i sees keys j with i - WINDOW < j <= i")]

    def describe(self, m) -> str:
        return f"sliding-window attention ({self.window} positions)"

    def template_context(self, m):
        return {"chunk": lit_int(chunk_for(self.window - 1, 1))}

    def blockwise_kept_bytes(self, m, mm: int) -> int:
        return blockwise_saved_bytes(m, mm, 0, self.window - 1, 1)

    # ── HF transformers interop (archspec.kinds.hf) ──
    # transformers' sliding layers mask keys with kv_idx > q_idx - sliding_window (masking_utils.sliding_window_overlay):
    # the query itself and the sliding_window - 1 before it, as here. Which layers slide is the model type's (Mistral:
    # all of them; Qwen2: layer_types); the window is one config key for every sliding layer.
    hf_block = "sliding_attention"

    @classmethod
    def from_hf(cls, cfg):
        window = cfg.take("sliding_window", int)
        if window < 1:
            raise cfg.refuse("sliding_window", f"{window}: a window holds at least the query itself")
        return {"kind": "sliding_window", "window": window}

    def to_hf(self, m, out, hf, path):
        out["sliding_window"] = self.window
        if "window_switch" in hf.keys:  # Qwen's use_sliding_window: without it transformers ignores the window
            out[hf.keys["window_switch"]] = True

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        # Windows shorter than, equal to and longer than the sequence (the last: dense in effect).
        return {"window": st.integers(1, ctx["context_length"] + 2)}
