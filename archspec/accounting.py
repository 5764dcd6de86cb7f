"""Exact, analytic accounting of a spec: parameters, FLOPs per token, KV-cache bytes. No instantiation.

Conventions (DESIGN.md):
- Parameters are exact and equal the `numel()` sum of the generated module's parameters (tied weights once).
  `embedding` is the token table plus a learned position table; an untied LM head is counted as `lm_head`.
  `active` counts routed experts at top_k / n_experts of their total (dense models: active == total).
- FLOPs count matrix multiplications only: an (m×k)·(k×n) product is 2·m·n·k. Norms, activations, softmax, RoPE
  rotations and embedding lookups are omitted (they are O(d) per token, not O(d²), and FlopCounterMode does not
  count them either). Per token, forward = 2 · (matmul weights) + attention, where the attention score (QKᵀ) and
  value (AV) products cost 2 · 2 · n_heads · head_dim · keys per layer.
  `keys` is the effective key count per query: with dense causal attention at sequence length T, query t sees t+1
  keys, so the average over a sequence is (T + 1) / 2. `full_attention=True` counts all T keys (what a math-path
  kernel actually multiplies, since it computes the masked half too).
  Train = 3 × forward (backward ≈ 2 × forward).
- KV cache bytes per token = 2 (K and V) · n_layers · n_kv_heads · head_dim · bytes per element.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from archspec.spec.model import ModelSpec, Spec

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Accounting:
    total: int
    active: int
    embedding: int
    by_component: dict[str, int]
    flops_forward: int  # per token
    flops_train: int  # per token
    kv_cache_bytes_per_token: int
    seq_len: int
    flops_by_component: dict[str, int] = field(default_factory=dict)  # forward, per token

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": {
                "total": self.total,
                "active": self.active,
                "embedding": self.embedding,
                "by_component": dict(self.by_component),
            },
            "flops_per_token": {"forward": self.flops_forward, "train": self.flops_train},
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
        }


# ── parameters, one function per union family (a new kind adds a branch in its family) ─────────────────────────


def norm_params(m: ModelSpec) -> int:
    n = m.norm
    if n.kind == "layernorm":
        return m.d_model * (2 if n.bias else 1)
    if n.kind == "rmsnorm":
        return m.d_model
    raise NotImplementedError(f"accounting for norm kind {n.kind!r}")


def attention_params(m: ModelSpec) -> int:
    a = m.attention
    q_width, kv_width = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    weights = m.d_model * q_width + 2 * m.d_model * kv_width + q_width * m.d_model
    biases = (q_width + 2 * kv_width + m.d_model) if a.bias else 0
    return weights + biases


def ffn_params(m: ModelSpec) -> tuple[int, int]:
    """(total, active) parameters of one FFN layer."""
    f, d = m.ffn, m.d_model
    if f.kind == "mlp":
        n = 2 * d * f.hidden_dim + ((f.hidden_dim + d) if f.bias else 0)
        return n, n
    if f.kind == "glu":
        n = 3 * d * f.hidden_dim + ((2 * f.hidden_dim + d) if f.bias else 0)
        return n, n
    raise NotImplementedError(f"accounting for ffn kind {f.kind!r}")


def position_params(m: ModelSpec) -> int:
    return m.context_length * m.d_model if m.attention.positional.kind == "learned" else 0


def param_breakdown(m: ModelSpec) -> tuple[dict[str, int], int]:
    """Parameters by component (summed over layers) and the active total."""
    ffn_total, ffn_active = ffn_params(m)
    parts = {
        "embedding": m.vocab_size * m.d_model,
        "position": position_params(m),
        "attention": m.n_layers * attention_params(m),
        "ffn": m.n_layers * ffn_total,
        "norm": (2 * m.n_layers + 1) * norm_params(m),
        "lm_head": 0 if m.tie_embeddings else m.vocab_size * m.d_model,
    }
    parts = {k: v for k, v in parts.items() if v or k in ("embedding", "attention", "ffn", "norm")}
    active = sum(parts.values()) - m.n_layers * (ffn_total - ffn_active)
    return parts, active


# ── FLOPs ────────────────────────────────────────────────────────────────────────────────────────────────────────


def attention_keys(m: ModelSpec, seq_len: int, full_attention: bool = False) -> float:
    """Average number of keys each query attends to (see the module docstring)."""
    if full_attention:
        return float(seq_len)
    s = m.attention.sparsity
    if s.kind == "dense":
        return (seq_len + 1) / 2
    raise NotImplementedError(f"accounting for sparsity kind {s.kind!r}")


def ffn_flops(m: ModelSpec) -> int:
    """Forward matmul FLOPs of one FFN layer for one token (active experts only)."""
    f, d = m.ffn, m.d_model
    if f.kind == "mlp":
        return 2 * 2 * d * f.hidden_dim
    if f.kind == "glu":
        return 2 * 3 * d * f.hidden_dim
    raise NotImplementedError(f"accounting for ffn kind {f.kind!r}")


def flops_breakdown(m: ModelSpec, seq_len: int, full_attention: bool = False) -> dict[str, int]:
    a = m.attention
    q_width, kv_width = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    projections = 2 * (m.d_model * q_width + 2 * m.d_model * kv_width + q_width * m.d_model)
    keys = attention_keys(m, seq_len, full_attention)
    # QKᵀ and AV: each 2 · head_dim · keys per head; exact as a rational, rounded once at the end.
    scores = 2 * 2 * a.n_heads * a.head_dim * keys
    return {
        "attention_proj": m.n_layers * projections,
        "attention_scores": round(m.n_layers * scores),
        "ffn": m.n_layers * ffn_flops(m),
        "lm_head": 2 * m.d_model * m.vocab_size,
    }


def kv_cache_bytes_per_token(m: ModelSpec, dtype: str = "bf16") -> int:
    a = m.attention
    return 2 * m.n_layers * a.n_kv_heads * a.head_dim * BYTES_PER_ELEMENT[dtype]


def account(spec: Spec | ModelSpec, seq_len: int | None = None, *, full_attention: bool = False,
            kv_dtype: str = "bf16") -> Accounting:
    """Accounting of a spec at `seq_len` tokens (default: the model's context_length).

    The KV cache is priced in bf16 (2 bytes), the dtype a cache is kept in for inference; pass kv_dtype="fp32"
    for a CPU fp32 cache.
    """
    m = spec.model if isinstance(spec, Spec) else spec
    seq_len = seq_len or m.context_length
    parts, active = param_breakdown(m)
    flops = flops_breakdown(m, seq_len, full_attention)
    forward = sum(flops.values())
    return Accounting(
        total=sum(parts.values()),
        active=active,
        embedding=parts["embedding"] + parts.get("position", 0),
        by_component=parts,
        flops_forward=forward,
        flops_train=3 * forward,
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(m, kv_dtype),
        seq_len=seq_len,
        flops_by_component=flops,
    )
