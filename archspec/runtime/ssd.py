"""Mamba-2's state-space duality (SSD; Dao & Gu, 2024): the selective scan a `mamba2` mixer runs, in three forms that
compute one function, and the state a layer keeps to continue it one position at a time.

Per head h (head_dim P, state N), with dt_t > 0 the step, A_h < 0 the decay rate, B_t, C_t (N) shared by the heads of a
group, the recurrence is

    S_t = exp(dt_t · A_h) · S_{t-1} + dt_t · x_t ⊗ B_t        S (P, N), x_t (P)
    y_t = S_t · C_t + D_h · x_t

- `ssd_recurrent`: that loop, position by position (the reference, and what decoding runs);
- `ssd_chunked`: the chunked training form in plain torch: within a chunk of Q positions an attention-like (Q × Q)
  product masked by the decays, between chunks the state carried by a loop over chunks. Memory is linear in T (no
  tensor is (T × T)), matmul FLOPs are `ssd_flops` exactly;
- on CUDA, `mamba_ssm`'s fused Triton kernel (`pip install archspec[mamba]`) when it imports, else the torch form;
  `ssd_scan` picks one and says which once (`SSD_PATH`).

`SSMCache` is a layer's decoding state: the conv input's last positions (archspec.runtime.ConvCache) and the state
S (B, H, P, N), a fixed size however long the sequence. `gated_rms_norm` is Mamba-2's output norm: y · silu(z) first,
then an RMSNorm per group of channels (transformers' Mamba2RMSNormGated; Qwen3-Next's gated norm is another order).
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from archspec.runtime.conv import ConvCache


# ── the recurrence (reference and decoding) ──────────────────────────────────────────────────────────────────────


def _per_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(..., G, N) → (..., H, N): each group's B or C for each of its heads (heads of a group are consecutive)."""
    return t.repeat_interleave(heads // t.size(-2), dim=-2)


def ssd_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One position: state (b, H, P, N), x (b, H, P), dt (b, H), A (H), B and C (b, G, N) → (y (b, H, P) without the
    D skip, the next state)."""
    heads = x.size(1)
    decay = torch.exp(dt * A)  # (b, H)
    Bh, Ch = _per_head(B, heads), _per_head(C, heads)  # (b, H, N)
    state = state * decay[..., None, None] + (dt[..., None] * x)[..., None] * Bh[:, :, None, :]  # (b, H, P, N)
    y = (state @ Ch[..., None]).squeeze(-1)  # (b, H, P)
    return y, state


def ssd_recurrent(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  D: torch.Tensor | None = None, initial_state: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x (b, T, H, P), dt (b, T, H) (after dt_bias and softplus), A (H), B and C (b, T, G, N), D (H) → (y (b, T, H,
    P), the final state (b, H, P, N)), position by position."""
    b, t, h, p = x.shape
    state = x.new_zeros(b, h, p, B.size(-1)) if initial_state is None else initial_state.to(x.dtype)
    ys = []
    for i in range(t):
        y, state = ssd_step(state, x[:, i], dt[:, i], A, B[:, i], C[:, i])
        ys.append(y)
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(b, 0, h, p)  # (b, T, H, P)
    if D is not None:
        y = y + x * D[:, None]
    return y, state


# ── the chunked form (training) ──────────────────────────────────────────────────────────────────────────────────


def chunking(seq_len: int, chunk_size: int) -> tuple[int, int]:
    """(chunk length, number of chunks) the chunked form uses at `seq_len`: chunks of `chunk_size`, or one chunk of
    the whole sequence when it is shorter; the last chunk is padded with zeros."""
    q = max(1, min(chunk_size, seq_len))
    return q, -(-seq_len // q)


def ssd_flops(seq_len: int, chunk_size: int, heads: int, head_dim: int, d_state: int, groups: int) -> float:
    """Matmul FLOPs per token of `ssd_chunked` at `seq_len` (2·m·n·k per product; the decays are elementwise): per
    chunk of Q, C·Bᵀ per group (2·Q²·N), the masked scores times x per head (2·Q²·P), each chunk's state per head
    (2·Q·N·P) and the carried state read by C per head (2·Q·N·P); padding of the last chunk included."""
    q, n_chunks = chunking(seq_len, chunk_size)
    per_chunk = 2 * q * q * d_state * groups + 2 * q * q * head_dim * heads + 4 * q * d_state * head_dim * heads
    return per_chunk * n_chunks / seq_len


def _segment_sum(a: torch.Tensor) -> torch.Tensor:
    """a (..., Q) → (..., Q, Q): out[i, j] = a[j+1] + ... + a[i] for j ≤ i (the log-decay from j to i), -inf above
    the diagonal (no reading ahead)."""
    q = a.size(-1)
    cum = torch.cumsum(a, dim=-1)
    out = cum[..., :, None] - cum[..., None, :]  # (..., Q, Q)
    mask = torch.ones(q, q, dtype=torch.bool, device=a.device).tril()
    return out.masked_fill(~mask, -math.inf)


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                chunk_size: int, D: torch.Tensor | None = None, initial_state: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked SSD scan: same arguments and result as `ssd_recurrent`, in chunks of `chunk_size` positions."""
    b, t, h, p = x.shape
    g, n = B.shape[-2:]
    if t == 0:
        state = x.new_zeros(b, h, p, n) if initial_state is None else initial_state.to(x.dtype)
        return x.new_zeros(b, 0, h, p), state
    q, nc = chunking(t, chunk_size)
    pad = nc * q - t
    xd = F.pad(x * dt[..., None], (0, 0, 0, 0, 0, pad))  # (b, nc·Q, H, P): the discretised input dt·x
    a = F.pad(dt * A, (0, 0, 0, pad))  # (b, nc·Q, H): log-decay of each step; 0 where padded
    B, C = (F.pad(m, (0, 0, 0, 0, 0, pad)).view(b, nc, q, g, n) for m in (B, C))  # (b, nc, Q, G, N)
    xd = xd.view(b, nc, q, h, p)
    a = a.view(b, nc, q, h).permute(0, 3, 1, 2)  # (b, H, nc, Q)
    a_cum = torch.cumsum(a, dim=-1)  # (b, H, nc, Q): log-decay from the chunk's start

    # 1. within each chunk: y_l = Σ_{s ≤ l} (C_l · B_s) · decay(s → l) · x_s, an attention-like masked product
    decay = torch.exp(_segment_sum(a))  # (b, H, nc, Q, Q)
    scores = torch.einsum("bclgn,bcsgn->bcgls", C, B)  # (b, nc, G, Q, Q): per group
    scores = scores.repeat_interleave(h // g, dim=2) * decay.permute(0, 2, 1, 3, 4)  # (b, nc, H, Q, Q)
    y = torch.einsum("bchls,bcshp->bclhp", scores, xd)  # (b, nc, Q, H, P)

    # 2. each chunk's own contribution to the state at its end: Σ_s decay(s → end) · x_s ⊗ B_s
    Bh, Ch = _per_head(B, h), _per_head(C, h)  # (b, nc, Q, H, N)
    to_end = torch.exp(a_cum[..., -1:] - a_cum)  # (b, H, nc, Q)
    states = torch.einsum("bclhn,bclhp->bchpn", Bh * to_end.permute(0, 2, 3, 1)[..., None], xd)  # (b, nc, H, P, N)

    # 3. the state at each chunk's start, carried chunk by chunk (nc steps: memory linear in T)
    state = x.new_zeros(b, h, p, n) if initial_state is None else initial_state.to(x.dtype)
    chunk_decay = torch.exp(a_cum[..., -1])  # (b, H, nc): decay across a whole chunk
    starts = []
    for c in range(nc):
        starts.append(state)
        state = state * chunk_decay[:, :, c, None, None] + states[:, c]
    start = torch.stack(starts, dim=1)  # (b, nc, H, P, N)

    # 4. what the carried state adds inside each chunk: decay(start → l) · C_l · S_start
    y_off = torch.einsum("bclhn,bchpn->bclhp", Ch, start)  # (b, nc, Q, H, P)
    y = y + y_off * torch.exp(a_cum).permute(0, 2, 3, 1)[..., None]
    y = y.reshape(b, nc * q, h, p)[:, :t]  # (b, T, H, P)
    if D is not None:
        y = y + x * D[:, None]
    # the final state: padded steps have decay 1 and input 0, so the last chunk's end state is the state after T
    return y, state


# ── the kernel choice ────────────────────────────────────────────────────────────────────────────────────────────

SSD_PATH: list[str] = []  # the path taken, once known: "mamba_ssm" or "torch"


def _mamba_ssm_kernel():
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except ImportError:  # not installed (or built for another torch: its extension then fails to import)
        return None
    return mamba_chunk_scan_combined


def _say_path(path: str, why: str) -> None:
    if not SSD_PATH:
        SSD_PATH.append(path)
        print(f"archspec: Mamba-2 scan on {path} ({why})", file=sys.stderr)


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             chunk_size: int, D: torch.Tensor | None = None, initial_state: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """`ssd_chunked`, or on CUDA mamba_ssm's fused chunked scan when it is installed (the same function)."""
    if x.is_cuda:
        kernel = _mamba_ssm_kernel()
        if kernel is not None:
            _say_path("mamba_ssm", "its Triton chunked scan")
            y, state = kernel(x, dt, A, B, C, chunk_size, D=D, initial_states=initial_state,
                              return_final_states=True)
            return y, state
        _say_path("torch", "mamba_ssm is not importable: pip install archspec[mamba]")
    return ssd_chunked(x, dt, A, B, C, chunk_size, D, initial_state)


# ── decoding state ───────────────────────────────────────────────────────────────────────────────────────────────


class SSMCache:
    """One Mamba-2 layer's decoding state: `conv`, the causal conv's input for its last kernel - 1 positions
    (ConvCache), and `ssm`, the scan's state (B, H, P, N), kept in float32 whatever the model's dtype. A fixed size
    however long the sequence. `rollback` > 0 keeps the states after each of the last `rollback` positions too (the
    positions fed with such a cache run step by step), so that `truncate` can take back up to that many (speculative
    decoding)."""

    def __init__(self, batch_size: int, conv_channels: int, kernel_size: int, heads: int, head_dim: int,
                 d_state: int, device=None, dtype=None, rollback: int = 0):
        self.conv = ConvCache(batch_size, conv_channels, kernel_size, device=device, dtype=dtype, rollback=rollback)
        self.ssm = torch.zeros(batch_size, heads, head_dim, d_state, device=device, dtype=torch.float32)
        self.rollback = rollback
        # states at lengths length - rollback, ..., length - 1 (the most recent last); `valid` of them are known
        self.history = torch.zeros(batch_size, rollback, heads, head_dim, d_state, device=device, dtype=torch.float32)
        self.valid = 0
        self.length = 0  # positions seen: the position of the next token

    def _push(self, state: torch.Tensor) -> None:
        """Make `state` the current one, keeping the one it replaces in the history."""
        if self.rollback:
            self.history = torch.cat([self.history[:, 1:], self.ssm[:, None]], dim=1)
            self.valid = min(self.valid + 1, self.rollback)
        self.ssm = state

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on (at most `rollback` of them)."""
        back = self.length - length
        if back <= 0:
            return
        if back > self.valid:
            raise ValueError(f"Mamba-2 cache keeps the states of {self.valid} positions to take back, asked for {back}")
        self.conv.truncate(length)
        self.ssm = self.history[:, self.rollback - back].clone()
        kept = self.history[:, : self.rollback - back].clone()
        self.history = torch.zeros_like(self.history)
        self.history[:, back:] = kept
        self.valid -= back
        self.length = length

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes + self.history.nbytes


def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
        chunk_size: int, cache: SSMCache | None = None) -> torch.Tensor:
    """The mixer's scan: x (b, T, H, P), dt (b, T, H), A (H), B and C (b, T, G, N), D (H) → y (b, T, H, P). Without a
    cache, the whole sequence (`ssd_scan`); with one, x continues the cached positions and the cache takes them: the
    chunked form from the cached state, and step by step for the positions it must be able to take back."""
    dtype = x.dtype  # the scan runs in float32: its decays are exponentials of sums
    x32, dt32, B32, C32 = x.float(), dt.float(), B.float(), C.float()
    if cache is None:
        return ssd_scan(x32, dt32, A, B32, C32, chunk_size, D)[0].to(dtype)
    t = x.size(1)
    stepped = min(t, cache.rollback) if cache.rollback else (1 if t == 1 else 0)
    ys = []
    if t - stepped:
        y, state = ssd_scan(x32[:, : t - stepped], dt32[:, : t - stepped], A, B32[:, : t - stepped],
                            C32[:, : t - stepped], chunk_size, None, cache.ssm)
        ys.append(y)
        cache.ssm = state.float()
        cache.valid = 0  # the states inside the chunked part are not kept
    for i in range(t - stepped, t):
        y, state = ssd_step(cache.ssm, x32[:, i], dt32[:, i], A, B32[:, i], C32[:, i])
        cache._push(state)
        ys.append(y[:, None])
    cache.length += t
    y = torch.cat(ys, dim=1)  # (b, T, H, P)
    return (y + x32 * D[:, None]).to(dtype)


# ── the gated output norm ────────────────────────────────────────────────────────────────────────────────────────


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """Mamba-2's output norm: y · silu(z) first, then an RMSNorm over each of `groups` equal slices of the channels,
    times `weight`. y, z (..., D_INNER) → (..., D_INNER), computed in float32."""
    dtype = y.dtype
    h = y.float() * F.silu(z.float())
    h = h.view(*h.shape[:-1], groups, -1)  # (..., groups, D_INNER / groups)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.flatten(-2).to(dtype)


class GatedRMSNorm(nn.Module):
    """`gated_rms_norm` with its gain (`weight`, ones at init): Mamba-2's norm on the scan's output."""

    def __init__(self, dim: int, groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.groups, self.eps = groups, eps

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(y, z, self.weight, self.groups, self.eps)
