"""Global + local attention (Longformer, Beltagy et al., 2020): a sliding window, plus the first `n_global` positions,
which every later query sees and which see every earlier position (attention stays causal)."""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, SparsityKind, TPPlan, lit_int, register
from archspec.kinds.limits import MAX_CONTEXT
from archspec.kinds.sparsity.blockwise import blockwise_saved_bytes, chunk_for
from archspec.kinds.sparsity.sliding_window import window_keys


def global_local_keys(seq_len: int, window: int, n_global: int) -> int:
    """Σ over queries t of the keys t sees: its window, plus the globals older than the window. Query t sees
    max(0, min(n_global, t - window + 1)) globals beyond its window; with j = t - window + 1 that is
    Σ_{j=1..T-window} min(n_global, j)."""
    n = max(0, seq_len - window)
    a = min(n_global, n)
    return window_keys(seq_len, window) + a * (a + 1) // 2 + (n - a) * n_global


@register
class GlobalLocalSparsity(SparsityKind):
    kind: Literal["global_local"] = "global_local"  # a local window plus the first n_global positions
    cache_class = "RollingKVCache"
    window: int = Field(256, ge=1, le=MAX_CONTEXT, description="positions of the local window, the query included")
    n_global: int = Field(1, ge=1, le=MAX_CONTEXT,
                          description="the first n_global positions are global (< context_length)")


    def tensor_parallel(self, m):
        """Heads attend independently: a rank's heads see the same keys as on one process; nothing to split."""
        return TPPlan()

    def problems(self, m, path):
        if self.n_global >= m.context_length:
            return [(path + ("n_global",), f"must be less than model.context_length ({m.context_length}), got "
                     f"{self.n_global} (every position global is dense attention: use kind dense)", self.n_global)]
        return []

    def keys(self, seq_len: int) -> Fraction:
        return Fraction(global_local_keys(seq_len, self.window, self.n_global), seq_len)

    def cached_positions(self, context_length: int) -> int:
        return min(self.n_global + self.window, context_length)  # the globals, then a rolling window

    def constants(self, m) -> list[Const]:
        return [Const("LOCAL_WINDOW", lit_int(self.window), "query i sees keys j with i - LOCAL_WINDOW < j <= i ..."),
                Const("N_GLOBAL", lit_int(self.n_global), "... and keys j < N_GLOBAL (causally)")]

    def describe(self, m) -> str:
        return f"global + local attention ({self.n_global} global, window {self.window})"

    def template_context(self, m):
        return {"chunk": lit_int(chunk_for(self.window - 1, 1))}

    def blockwise_kept_bytes(self, m, mm: int) -> int:
        return blockwise_saved_bytes(m, mm, self.n_global, self.window - 1, 1)

    @classmethod
    def strategy(cls, ctx):
        return super().strategy(ctx) if ctx["context_length"] >= 2 else None  # n_global < context_length

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        n = ctx["context_length"]
        return {"window": st.integers(1, n + 2), "n_global": st.integers(1, max(1, n - 1))}
