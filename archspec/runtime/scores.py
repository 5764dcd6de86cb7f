"""Attention whose scores are changed before the softmax: a softmax scale other than 1/sqrt(head_dim), tanh
soft-capping (Gemma 2: scores ← cap · tanh(scores / cap)) and ALiBi's per-head linear bias (Press et al., 2022:
scores + slope_h · (key position − query position)). SDPA applies none of the last two, so a layer that uses them
takes `score_mod_attention`, which materialises the scores (only such layers: the others keep SDPA). The sparse
paths (archspec.runtime.sparse) apply the same three in their tiles and in FlexAttention's `score_mod`; the order is
everywhere the one here: scale, then cap, then the bias and the mask.

Attention sinks (gpt-oss; Xiao et al., 2023's sink as a learned logit): `sinks` (N_HEADS,) is one logit per head that
joins every softmax's denominator as an extra column with no value, so a query may attend to "nothing":
p_j = exp(s_j) / (exp(sink_h) + Σ_k exp(s_k)). It is added after the mask, unscaled and uncapped (transformers'
gpt_oss concatenates it to the masked scores), and has a gradient of its own: −p_sink · Σ_D dy ∘ y per query.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def alibi_bias(alibi: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """ALiBi's bias: slope_h · (k_pos − q_pos) (≤ 0 for every visible key), (heads, queries, keys) in fp32."""
    offsets = (k_pos[None, :] - q_pos[:, None]).to(torch.float32)  # (queries, keys)
    return alibi.to(torch.float32)[:, None, None] * offsets  # (heads, queries, keys)


def capped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """cap · tanh(scores / cap): scores bounded to (−cap, cap), nearly unchanged well inside (Gemma 2)."""
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


# Observers of the attention logits (archspec.train.metrics.StabilityProbe, during an evaluation only): each is called
# with q, k, the (T, S) boolean mask of what each query sees and the scale, before the scores are capped or biased
# (the max logit is the raw one). Called by sparse_attention and score_mod_attention, the entry points SDPA is not.
# Empty otherwise: nothing is built.
logit_observers: list = []


def sink_softmax(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dimension of `scores` (fp32, (..., H, rows, keys) with the heads third from the end, or
    already laid out so that `sinks` broadcasts), with one more column per head holding its sink logit, dropped after:
    each row sums to 1 − p_sink. None: the plain softmax."""
    if sinks is None:
        return scores.softmax(dim=-1)
    column = sinks.to(scores.dtype).expand(scores.shape[:-1]).unsqueeze(-1)  # (..., 1) the sink's logit per row
    return torch.cat([scores, column], dim=-1).softmax(dim=-1)[..., :-1]


def score_mod_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                        q_pos: torch.Tensor | None = None, k_pos: torch.Tensor | None = None,
                        dropout_p: float = 0.0, scale: float | None = None, softcap: float | None = None,
                        alibi: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, H, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv) → (B, H, T, Dv); H_kv divides H (GQA: each K/V head
    serves H // H_kv query heads, never copied).

    Scores are q·k · scale (default 1/sqrt(D)), capped at ±softcap, plus alibi[h] · (k_pos − q_pos), then masked
    and softmaxed in fp32, with each head's sink logit (`sinks`, (H,)) in the denominator. `mask` (T, S), True where a query sees a key; None: causal, the T queries being the last T
    of the S positions (q_pos and k_pos then default to those positions)."""
    B, H, T, D = q.shape
    H_kv, S = k.size(1), k.size(2)
    G = H // H_kv
    if q_pos is None:
        q_pos = torch.arange(S - T, S, device=q.device)
    if k_pos is None:
        k_pos = torch.arange(S, device=q.device)
    if mask is None:
        mask = k_pos[None, :] <= q_pos[:, None]  # (T, S): causal, aligned bottom-right
    for observe in logit_observers:
        observe(q, k, mask, scale)
    scale = D**-0.5 if scale is None else scale
    scores = torch.matmul(q.view(B, H_kv, G, T, D), k[:, :, None].transpose(-1, -2)) * scale  # (B, H_kv, G, T, S)
    scores = capped(scores.float(), softcap)
    if alibi is not None:
        scores = scores + alibi_bias(alibi, q_pos, k_pos).view(H_kv, G, T, S)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = sink_softmax(scores, None if sinks is None else sinks.view(H_kv, G, 1)).to(q.dtype)  # (B, H_kv, G, T, S)
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p)
    y = torch.matmul(probs, v[:, :, None])  # (B, H_kv, G, T, Dv)
    return y.view(B, H, T, v.size(-1))
