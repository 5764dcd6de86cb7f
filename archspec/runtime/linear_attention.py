"""The gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024; Qwen3-Next's linear attention layers): a
linear-attention mixer whose state S (per head, K_DIM × V_DIM) is a fast-weight memory, decayed and corrected at
every position. With q_t, k_t L2-normalised, α_t = exp(g_t) ∈ (0, 1] the decay and β_t ∈ (0, 1) the write strength:

    S_t = α_t · S_{t-1} + k_t · (β_t · (v_t − α_t · S_{t-1}ᵀ k_t))ᵀ        (the delta rule: write what S mispredicts)
    o_t = S_tᵀ q_t

Three forms of it live here, once: `gated_delta_rule_recurrent` (position by position: the reference, and one decode
step), `gated_delta_rule_chunked` (plain torch, for training on any device: chunks of C positions solved with the WY
representation, one C × C triangular solve per chunk, a sequential scan over T / C chunks; memory linear in T), and
`gated_delta_rule`, which takes flash-linear-attention's Triton kernel on CUDA when `fla` is importable
(`pip install archspec[fla]`) and the torch chunked form otherwise, saying once which. `DeltaRuleCache` is one
layer's decoding state: the short conv's last positions and S, a fixed size however long the sequence.
"""

from __future__ import annotations

import sys

import torch

from archspec.runtime.conv import ConvCache

_SAID: set[str] = set()


def _say_once(path: str) -> None:
    if path not in _SAID:
        _SAID.add(path)
        print(f"archspec: gated delta rule via {path}", file=sys.stderr)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(Σ x² + eps) over the last dimension (FLA's and transformers' l2norm, same eps)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                               state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence, one position at a time. q, k (B, T, H, K_DIM) (q already scaled), v (B, T, H, V_DIM), g (B, T, H)
    the log decay (≤ 0), beta (B, T, H); state (B, H, K_DIM, V_DIM) or None (zeros). Returns o (B, T, H, V_DIM) in
    q's dtype and the state after the last position (in float32, or float64 for float64 inputs)."""
    work = torch.promote_types(q.dtype, torch.float32)
    B, T, H, DK = k.shape
    S = torch.zeros(B, H, DK, v.size(-1), dtype=work, device=q.device) if state is None else state.to(work)
    out = []
    for t in range(T):
        q_t, k_t, v_t = q[:, t].to(work), k[:, t].to(work), v[:, t].to(work)  # (B, H, ·)
        S = S * g[:, t].to(work).exp()[..., None, None]  # decay
        predicted = torch.einsum("bhk,bhkv->bhv", k_t, S)  # what the memory holds for k_t
        delta = (v_t - predicted) * beta[:, t].to(work)[..., None]  # the correction, scaled by the write strength
        S = S + k_t[..., :, None] * delta[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q_t, S))
    return torch.stack(out, dim=1).to(q.dtype), S


def gated_delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                             chunk_size: int = 64, state: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same function as `gated_delta_rule_recurrent`, chunk by chunk (the WY form of DeltaNet, Yang et al. 2024,
    with the decay of Gated DeltaNet). Positions are padded to a multiple of `chunk_size` (g = β = k = 0 there: no
    effect on S). Inside a chunk of C positions, with γ_i the cumulative log decay and D_ij = exp(γ_i − γ_j) (i ≥ j):

        A = tril(diag(β) K Kᵀ ⊙ D, −1)       U = (I + A)⁻¹ diag(β) V      W = (I + A)⁻¹ diag(β exp(γ)) K
        V' = U − W S                         O = diag(exp(γ)) Q S + (Q Kᵀ ⊙ D) V'
        S ← exp(γ_C) S + (diag(exp(γ_C − γ)) K)ᵀ V'

    Matmul FLOPs per head and chunk (what GatedDeltaNetSpec.mixer_flops counts): 2·C²·K_DIM twice (A, QKᵀ), the two
    unit-triangular solves C·(C − 1)·(V_DIM + K_DIM), and 2·C·K_DIM·V_DIM three times (W S, Q S, Kᵀ V') plus
    2·C²·V_DIM ((QKᵀ ⊙ D) V'). Memory: a few C × C tiles per chunk, so linear in T."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    work = torch.promote_types(q.dtype, torch.float32)
    B, T, H, DK = k.shape
    DV, C = v.size(-1), chunk_size
    pad = (-T) % C
    N = (T + pad) // C

    def chunks(x: torch.Tensor) -> torch.Tensor:  # (B, T, H, ...) → (B, H, N, C, ...), zeros past T
        x = x.to(work).transpose(1, 2)
        x = torch.nn.functional.pad(x, (0, 0, 0, pad)) if x.dim() == 4 else torch.nn.functional.pad(x, (0, pad))
        return x.reshape(B, H, N, C, *x.shape[3:])

    q, k, v, g, beta = chunks(q.to(work)), chunks(k), chunks(v), chunks(g), chunks(beta)
    gamma = g.cumsum(dim=-1)  # (B, H, N, C): log of the decay from the chunk's start to each position
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    D = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # (B, H, N, C, C)
    k_beta = k * beta[..., None]
    A = (k_beta @ k.transpose(-1, -2)) * D  # its strictly lower part is A above; the solves read no more
    U = torch.linalg.solve_triangular(A, v * beta[..., None], upper=False, unitriangular=True)  # (B, H, N, C, DV)
    W = torch.linalg.solve_triangular(A, k_beta * gamma.exp()[..., None], upper=False, unitriangular=True)
    QK = (q @ k.transpose(-1, -2)) * D  # (B, H, N, C, C): within-chunk reads, its diagonal included
    q_in = q * gamma.exp()[..., None]  # each position reads S decayed to it
    k_out = k * (gamma[..., -1:] - gamma).exp()[..., None]  # each position's write, decayed to the chunk's end
    last = gamma[..., -1].exp()[..., None, None]  # (B, H, N, 1, 1): S's decay across a whole chunk
    S = torch.zeros(B, H, DK, DV, dtype=work, device=q.device) if state is None else state.to(work)
    out = []
    # The sequential scan over chunks. Each tensor is unbound into its chunks once: indexing it inside the loop would
    # make backward build a whole-sequence gradient per chunk (quadratic in T).
    for u, w, qi, qk, ko, decay in zip(*(x.unbind(2) for x in (U, W, q_in, QK, k_out, last))):
        V_new = u - w @ S  # (B, H, C, DV): the corrections, given what S already holds
        out.append(qi @ S + qk @ V_new)
        S = S * decay + ko.transpose(-1, -2) @ V_new
    o = torch.stack(out, dim=2).reshape(B, H, N * C, DV)[:, :, :T].transpose(1, 2)
    return o, S


def _fla():
    """flash-linear-attention's chunked kernel, or None when the package is not installed."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except (ImportError, RuntimeError):  # not installed, or installed without a working Triton
        return None
    return chunk_gated_delta_rule


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     chunk_size: int = 64, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked gated delta rule (shapes as `gated_delta_rule_recurrent`; q scaled, q and k L2-normalised): FLA's
    Triton kernel on CUDA when `fla` is importable, else the torch chunked form. The first call says which (stderr)."""
    kernel = _fla() if q.is_cuda else None
    if kernel is not None:
        _say_once("flash-linear-attention (fla.ops.gated_delta_rule.chunk_gated_delta_rule)")
        o, S = kernel(q, k, v, g=g.float(), beta=beta, scale=1.0,
                      initial_state=None if state is None else state.float(), output_final_state=True)
        return o.to(q.dtype), S
    _say_once(f"the torch chunked form on {q.device.type}" + (" (fla is not installed: pip install archspec[fla])"
                                                             if q.is_cuda else ""))
    o, S = gated_delta_rule_chunked(q, k, v, g, beta, chunk_size, state)
    return o.to(q.dtype), S


class DeltaRuleCache:
    """One Gated DeltaNet layer's decoding state: the short conv's last `kernel_size - 1` input positions (a ConvCache)
    and the delta-rule state S (B, heads, key_dim, value_dim), kept in float32 whatever the model's dtype. A fixed size
    however long the sequence. With `rollback` > 0 it also keeps S after each of the last `rollback` positions, so that
    `truncate` can take back up to that many (speculative decoding's rejected drafts)."""

    def __init__(self, batch_size: int, conv_channels: int, kernel_size: int, n_heads: int, key_dim: int,
                 value_dim: int, device=None, dtype=None, rollback: int = 0):
        self.conv = ConvCache(batch_size, conv_channels, kernel_size, device=device, dtype=dtype, rollback=rollback)
        self.state = torch.zeros(batch_size, n_heads, key_dim, value_dim, device=device, dtype=torch.float32)
        self.rollback = rollback
        self.kept: dict[int, torch.Tensor] = {}  # positions seen → S after them (the last `rollback` positions)

    @property
    def length(self) -> int:
        return self.conv.length  # positions seen (the conv takes each call's positions first)

    def update(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               chunk_size: int) -> torch.Tensor:
        """Run the T positions ending at `length` (the conv has taken them) from the cached S; keep the new S.
        Returns o (B, T, heads, value_dim)."""
        T, end = q.size(1), self.length
        stepped = min(self.rollback, T) if self.rollback else (T if T == 1 else 0)  # one at a time: S after each
        S, outs = self.state, []
        if T > stepped:
            o, S = gated_delta_rule(q[:, : T - stepped], k[:, : T - stepped], v[:, : T - stepped],
                                    g[:, : T - stepped], beta[:, : T - stepped], chunk_size, S)
            outs.append(o)
        for t in range(T - stepped, T):
            if self.rollback:
                self.kept[end - T + t] = S.clone()
            o, S = gated_delta_rule_recurrent(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1],
                                              beta[:, t:t + 1], S)
            outs.append(o)
        for n in [n for n in self.kept if n < end - self.rollback]:
            del self.kept[n]
        self.state.copy_(S)
        return torch.cat(outs, dim=1)

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on (at most `rollback` of them)."""
        back = self.length - length
        if back <= 0:
            return
        if back > self.rollback or length not in self.kept:
            raise ValueError(f"delta-rule cache keeps {self.rollback} positions to take back, asked for {back}")
        self.conv.truncate(length)
        self.state.copy_(self.kept[length])
        for n in [n for n in self.kept if n >= length]:
            del self.kept[n]

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.state.nbytes + sum(s.nbytes for s in self.kept.values())
