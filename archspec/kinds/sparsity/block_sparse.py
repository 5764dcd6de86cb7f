"""Block-sparse attention (Child et al., 2019; BigBird's block pattern): the sequence is cut into blocks of
`block_size` positions; a query sees its own block (causally), the `n_blocks_back` blocks before it and, with
`global_first_block`, the first block."""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, SparsityKind, TPPlan, lit_bool, lit_int, register
from archspec.kinds.limits import MAX_CONTEXT
from archspec.kinds.sparsity.blockwise import blockwise_saved_bytes, chunk_for


def block_sparse_keys(seq_len: int, block_size: int, n_blocks_back: int, global_first_block: bool) -> int:
    """Σ over queries t of the keys t sees. Query t in block b = t // block_size at offset r sees r + 1 keys of its
    own block, min(b, n_blocks_back) whole blocks before it, and the first block when it is not among those."""
    bs, nb = block_size, n_blocks_back
    full, rem = divmod(seq_len, bs)

    def blocks_back(n: int) -> int:  # Σ_{b=0..n-1} min(b, nb)
        return n * (n - 1) // 2 if n <= nb + 1 else nb * (nb + 1) // 2 + (n - nb - 1) * nb

    total = full * bs * (bs + 1) // 2 + bs * bs * blocks_back(full)  # the whole blocks
    total += rem * (rem + 1) // 2 + rem * bs * min(full, nb)  # the last, partial block
    if global_first_block:
        total += bs * bs * max(0, full - nb - 1) + (rem * bs if full > nb else 0)
    return total


@register
class BlockSparsity(SparsityKind):
    kind: Literal["block_sparse"] = "block_sparse"  # own block, n_blocks_back blocks before it, maybe the first block
    cache_class = "RollingKVCache"
    block_size: int = Field(64, ge=1, le=MAX_CONTEXT, description="positions per block (T need not be a multiple)")
    n_blocks_back: int = Field(3, ge=0, le=MAX_CONTEXT, description="whole blocks before its own a query sees")
    global_first_block: bool = Field(True, description="every query also sees the first block")


    def tensor_parallel(self, m):
        """Heads attend independently: a rank's heads see the same keys as on one process; nothing to split."""
        return TPPlan()

    def keys(self, seq_len: int) -> Fraction:
        return Fraction(block_sparse_keys(seq_len, self.block_size, self.n_blocks_back, self.global_first_block),
                        seq_len)

    def cached_positions(self, context_length: int) -> int:
        # A rolling buffer of the reach (a query's own block and those before it), after the first block if global.
        return min(self._reach + (self.block_size if self.global_first_block else 0), context_length)

    @property
    def _reach(self) -> int:
        """The farthest key a query sees, globals aside, counting the query: from its block's start, N back."""
        return (self.n_blocks_back + 1) * self.block_size

    def max_lookback(self) -> int | None:
        return None if self.global_first_block else self._reach

    def constants(self, m) -> list[Const]:
        return [Const("BLOCK_SIZE", lit_int(self.block_size), "positions per block"),
                Const("N_BLOCKS_BACK", lit_int(self.n_blocks_back), "whole blocks before its own a query sees"),
                Const("GLOBAL_FIRST_BLOCK", lit_bool(self.global_first_block),
                      "every query also sees block 0" if self.global_first_block else
                      "block 0 is seen only from within N_BLOCKS_BACK blocks")]

    def describe(self, m) -> str:
        first = ", plus the first block" if self.global_first_block else ""
        return f"block-sparse attention (blocks of {self.block_size}, {self.n_blocks_back} back{first})"

    def _blockwise(self) -> tuple[int, int, int]:  # (n_global, lookback, align) of its SparsePattern
        return (self.block_size if self.global_first_block else 0, self.n_blocks_back * self.block_size,
                self.block_size)

    def template_context(self, m):
        n_global, lookback, align = self._blockwise()
        return {"global_first_block": bool(self.global_first_block), "chunk": lit_int(chunk_for(lookback, align))}

    def blockwise_kept_bytes(self, m, mm: int) -> int:
        return blockwise_saved_bytes(m, mm, *self._blockwise())

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        return {"block_size": st.integers(1, ctx["context_length"] + 2), "n_blocks_back": st.integers(0, 4)}
