"""Media for gated cross-attention (Flamingo): which media item each text token sees, the masked attention from text
to media tokens, and the cache that holds a layer's media keys and values, computed once per media.

Visibility (Flamingo, Alayrac et al. 2022, section 2.3; IDEFICS' `only_attend_immediate_previous_image`): media
item j sits where the j-th marker token stands in the text. A text token attends only to the tokens of the
immediately preceding item, the last one whose marker is at or before its position (the marker itself included);
a token before the first marker, or after a marker whose item was not given, sees no media, and its cross-attention
output is zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def media_items(idx: torch.Tensor, marker_id: int, n_items: int, seen: torch.Tensor | None = None) -> torch.Tensor:
    """idx (B, T) → the media item each token sees (B, T): the index of the last marker at or before it, counting
    `seen` (B,) markers before idx[:, 0] (a cache's); -1 where it sees none (no marker yet, or item >= n_items)."""
    item = (idx == marker_id).long().cumsum(dim=1) - 1  # (B, T)
    if seen is not None:
        item = item + seen[:, None]
    return item.masked_fill(item >= n_items, -1)


def media_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, item: torch.Tensor,
                    tokens_per_item: int) -> torch.Tensor:
    """q (B, H, T, hd) text queries; k, v (B, H, S, hd) the media's keys and values, item j's tokens at
    j·tokens_per_item onwards; item (B, T) the item each query sees (-1: none) → (B, H, T, hd), zero for a query that
    sees no item."""
    S = k.size(2)
    key_item = torch.arange(S, device=k.device) // tokens_per_item  # (S,): the item each media token belongs to
    sees = item[:, :, None] == key_item  # (B, T, S)
    blind = item < 0  # (B, T): no media for this token
    # A row with no visible key would softmax over nothing (NaN): let it see every key, then zero its output.
    mask = sees | blind[:, :, None]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])  # (B, H, T, hd)
    return y.masked_fill(blind[:, None, :, None], 0.0)


class MediaCache:
    """One cross-attention layer's decoding state: its keys and values of the media's tokens, computed once when
    the cache is made (`fill`), room for `max_items` items, and the item each cached text position sees (so that a
    continuation knows how many markers came before, and `truncate` can take positions back). `nbytes` counts the
    keys and values; the per-position item index is bookkeeping, as a cache's `length` is."""

    def __init__(self, batch_size: int, n_heads: int, max_items: int, tokens_per_item: int, head_dim: int,
                 max_len: int, device=None, dtype=None):
        shape = (batch_size, n_heads, max_items * tokens_per_item, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (B, n_heads, max_items · tokens, head_dim)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.item = torch.full((batch_size, max_len), -1, dtype=torch.long, device=device)  # (B, max_len)
        self.n_items = 0  # media items given
        self.markers = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,): markers seen so far
        self.length = 0  # text positions seen

    def fill(self, k: torch.Tensor, v: torch.Tensor, n_items: int) -> None:
        """Store the media's keys and values (B, n_heads, n_items · tokens, head_dim), once."""
        self.k[:, :, : k.size(2)] = k
        self.v[:, :, : v.size(2)] = v
        self.n_items = n_items

    def media(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k, self.v

    def advance(self, idx: torch.Tensor, marker_id: int) -> torch.Tensor:
        """Take the next T text tokens idx (B, T); return the item each sees (B, T), -1 for none."""
        end = self.length + idx.size(1)
        if end > self.item.size(1):
            raise ValueError(f"media cache full: {end} positions, room for {self.item.size(1)}")
        markers = (idx == marker_id).long().cumsum(dim=1) + self.markers[:, None]  # (B, T): markers up to each
        item = (markers - 1).masked_fill(markers - 1 >= self.n_items, -1)
        self.item[:, self.length : end] = markers - 1
        self.markers = markers[:, -1]
        self.length = end
        return item

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on (speculative decoding drops rejected draft tokens)."""
        if length >= self.length:
            return
        self.markers = self.item[:, length - 1] + 1 if length > 0 else torch.zeros_like(self.markers)
        self.item[:, length:] = -1
        self.length = length

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
