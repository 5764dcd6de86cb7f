"""Short causal convolutions (LFM2's gated short conv mixer): the depthwise causal conv over a sequence, and the
state a layer keeps to continue it one position at a time."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ConvCache:
    """One layer's convolution state for generation: the last `kernel_size - 1` positions of the conv's input (what
    the next position's output reads besides itself), a fixed size however long the sequence grows. `rollback` more
    positions are kept so that `truncate` can take back up to that many (speculative decoding)."""

    def __init__(self, batch_size: int, channels: int, kernel_size: int, device=None, dtype=None, rollback: int = 0):
        self.reach = kernel_size - 1  # past positions one output reads
        self.rollback = rollback
        # (B, channels, reach + rollback): the most recent positions last, zeros before the sequence starts
        self.state = torch.zeros(batch_size, channels, self.reach + rollback, device=device, dtype=dtype)
        self.length = 0  # positions seen: the position of the next token

    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Take T new positions' conv input x (B, channels, T); return it behind the `reach` positions before it
        (B, channels, reach + T), what a causal conv of kernel_size over x needs."""
        width = self.state.size(-1)
        past = self.state[..., width - self.reach:]  # (B, channels, reach)
        full = torch.cat([past, x.to(self.state.dtype)], dim=-1)  # (B, channels, reach + T)
        self.state.copy_(torch.cat([self.state, x.to(self.state.dtype)], dim=-1)[..., -width:])  # in place
        self.length += x.size(-1)
        return full

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on: shift the kept positions back by as many (at most `rollback`)."""
        back = self.length - length
        if back <= 0:
            return
        if back > self.rollback:
            raise ValueError(f"conv cache keeps {self.rollback} positions to take back, asked for {back}")
        kept = self.state[..., : self.state.size(-1) - back].clone()
        self.state.zero_()
        self.state[..., back:] = kept
        self.length = length

    @property
    def nbytes(self) -> int:
        return self.state.nbytes


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  cache: ConvCache | None = None) -> torch.Tensor:
    """x (B, channels, T) → (B, channels, T): each channel convolved with its own kernel (weight (channels, 1, K))
    over its last K positions, the current one included; before the sequence (or the cache's first position), zeros.
    With a `cache`, x continues the cached positions and the cache takes x."""
    reach = weight.size(-1) - 1
    if cache is None:
        full = F.pad(x, (reach, 0))  # (B, channels, reach + T): zeros before position 0
    else:
        full = cache.append(x)  # (B, channels, reach + T): the cached positions before x
    return F.conv1d(full, weight, bias, groups=x.size(1))  # (B, channels, T)
