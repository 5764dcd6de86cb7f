"""The dense KV cache: every position's keys and values, for the layers whose attention sees every earlier key."""

from __future__ import annotations

import torch


class KVCache:
    """One layer's keys and values for the positions generated so far, so each new token costs one position's
    forward, not the whole sequence's. Holds the layer's K/V heads (n_kv_heads, not the query heads: GQA and MQA
    shrink it), preallocated for `max_len` positions."""

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int, device=None, dtype=None):
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (B, n_kv_heads, max_len, head_dim)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # positions stored: the position of the next token

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store T new positions' k, v (B, n_kv_heads, T, head_dim); return every stored position's."""
        end = self.length + k.size(2)
        if end > self.k.size(2):
            raise ValueError(f"KV cache full: {end} positions, room for {self.k.size(2)}")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, n_kv_heads, end, head_dim) each

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on (speculative decoding drops rejected draft tokens)."""
        self.length = min(self.length, length)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def causal_mask(T: int, S: int, device: torch.device) -> torch.Tensor | None:
    """(T, S) boolean mask for the last T of S positions: query i sits at position S - T + i and sees keys
    0 .. S - T + i (causality aligned bottom-right). None for a single query, which sees every key."""
    if T == 1:
        return None
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)  # (T, S)


class LatentCache:
    """A multi-head latent attention layer's cache (DeepSeek-V2/V3): per position its normalised KV latent and its
    rotated rope key, from which every head's keys and values are recomputed, instead of N_HEADS keys and values.
    Preallocated for `max_len` positions."""

    def __init__(self, batch_size: int, max_len: int, latent_dim: int, rope_dim: int, device=None, dtype=None):
        self.latent = torch.zeros(batch_size, max_len, latent_dim, device=device, dtype=dtype)  # (B, max_len, latent)
        self.k_pe = torch.zeros(batch_size, 1, max_len, rope_dim, device=device, dtype=dtype)  # (B, 1, max_len, rope)
        self.length = 0  # positions stored: the position of the next token

    def append(self, latent: torch.Tensor, k_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store T new positions' latent (B, T, latent) and rope key (B, 1, T, rope); return every stored position's."""
        end = self.length + latent.size(1)
        if end > self.latent.size(1):
            raise ValueError(f"KV cache full: {end} positions, room for {self.latent.size(1)}")
        self.latent[:, self.length : end] = latent
        self.k_pe[:, :, self.length : end] = k_pe
        self.length = end
        return self.latent[:, :end], self.k_pe[:, :, :end]  # (B, end, latent), (B, 1, end, rope)

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on (speculative decoding drops rejected draft tokens)."""
        self.length = min(self.length, length)

    @property
    def nbytes(self) -> int:
        return self.latent.nbytes + self.k_pe.nbytes
