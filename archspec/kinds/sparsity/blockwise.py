"""What the sparse patterns share on the Python side: the blockwise path's chunk size (the templates receive it as a
literal) and what that path keeps for backward (archspec.memory). The code itself is sparse_attention.py.j2."""

from __future__ import annotations

from typing import Any

SPARSE_CHUNK = 128  # most queries per tile (bench/bench_sparse.py: 64-128 run best on CPU)


def chunk_for(lookback: int, align: int) -> int:
    """Queries per tile: about half the lookback (computed keys at most ~1.5× the needed ones), 16 to SPARSE_CHUNK,
    rounded up to whole blocks of `align`."""
    target = min(SPARSE_CHUNK, max(16, -(-lookback // 32) * 16))
    return align * -(-target // align)


def tile_keys(m: Any, n_global: int, lookback: int, align: int) -> int:
    """Keys each query's tile holds: the globals, then a band of chunk + lookback positions."""
    return min(n_global, m.context_length) + chunk_for(lookback, align) + lookback


def blockwise_saved_elements(m: Any, n_global: int, lookback: int, align: int) -> int:
    """Per token, beyond what SDPA keeps: the softmax output (every query head × its tile's keys), the gathered K and
    V tiles (each key copied into the tiles that hold it: keys / chunk copies), and the scaled copy of q."""
    a = m.attention
    keys = tile_keys(m, n_global, lookback, align)
    return a.n_heads * keys + 2 * a.n_kv_heads * a.head_dim * keys // chunk_for(lookback, align) + a.n_heads * a.head_dim
