"""What the sparse patterns share on the Python side: the blockwise path's chunk size (the templates receive it as a
literal) and what that path keeps for backward (archspec.memory). The code itself is archspec.runtime.sparse."""

from __future__ import annotations

from typing import Any

SPARSE_CHUNK = 64  # most queries per tile (bench/bench_sparse.py: window 256 runs best at 64, 1024 at 64-128)


def chunk_for(lookback: int, align: int) -> int:
    """Queries per tile: about half the lookback (computed keys at most ~1.5× the needed ones), 16 to SPARSE_CHUNK,
    rounded up to whole blocks of `align`."""
    target = min(SPARSE_CHUNK, max(16, -(-lookback // 32) * 16))
    return align * -(-target // align)


def tile_keys(m: Any, n_global: int, lookback: int, align: int) -> int:
    """The most keys a query's tile holds: the globals, then a band of chunk + lookback positions."""
    return min(n_global, m.context_length) + chunk_for(lookback, align) + lookback


def blockwise_saved_bytes(m: Any, mm: int, n_global: int, lookback: int, align: int) -> int:
    """Per token, what the blockwise path keeps for backward (it recomputes every tile there): q, k and v (contiguous:
    copies of the caller's strided views, which it then no longer holds) and its output (which the output projection
    keeps too: one tensor), in the matmul dtype; with attention dropout, a one-byte keep-mask per tile entry (at most
    every query head × its tile's keys: the first chunks' bands are shorter)."""
    a = m.attention
    kept = a.attention_io_elements() * mm
    return kept + (a.n_heads * tile_keys(m, n_global, lookback, align) if m.dropout > 0 else 0)
