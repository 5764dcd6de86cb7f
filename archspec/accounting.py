"""Exact, analytic accounting of a spec: parameters, FLOPs per token, KV-cache bytes. No instantiation.

The figures come from the units (`archspec.kinds`): each kind says its parameters and FLOPs; this module sums them
over the model. Conventions (docs/guides/generated-model.md, "Accounting"):
- Parameters are exact and equal the `numel()` sum of the generated module's parameters (tied weights once).
  `embedding` is the token table plus any position parameters; an untied LM head is counted as `lm_head`.
  `active` counts routed experts at top_k / n_experts of their total (dense models: active == total).
- FLOPs count matrix multiplications only: an (m×k)·(k×n) product is 2·m·n·k. Norms, activations, softmax, RoPE
  rotations and embedding lookups are omitted (they are O(d) per token, not O(d²), and FlopCounterMode does not
  count them either). Per token, forward = 2 · (matmul weights) + attention, where the attention score (QKᵀ) and
  value (AV) products cost 2 · 2 · n_heads · head_dim · keys per layer (multi-head latent attention: 2 · n_heads ·
  (qk_nope + qk_rope + v_head_dim) · keys).
  `keys` is the effective key count per query, from the layer's attention pattern: with dense causal attention at
  sequence length T, query t sees t+1 keys, so the mean over a sequence is (T + 1) / 2. `full_attention=True`
  counts all T keys (what a math-path kernel actually multiplies, since it computes the masked half too).
  Train = 3 × forward (backward ≈ 2 × forward).
- KV cache bytes per token = Σ over layers of what the layer's attention kind caches per token (2 (K and V) ·
  n_kv_heads · head_dim; multi-head latent attention: kv_lora_rank + qk_rope_head_dim) · bytes per element. Per sequence
  at context_length, each layer holds what its pattern needs (`cached_positions`: a window layer at most its window).
- Token mixers other than attention (archspec.kinds.base.MixerKind) are counted through the same contract, under
  their own columns (`MixerKind.component`, params and FLOPs); a fixed decoding state (a short conv keeps
  L_cache - 1 positions), so it adds to the per-sequence bytes and nothing per token.
- Multi-token prediction (model.mtp, DeepSeek-V3 §2.2): its modules are parameters of the generated module, so
  `total` and `active` count them (under `by_component["mtp"]`); `mtp_params`, `mtp_active` say how many, and
  `main_total`, `main_active` what inference keeps (it drops the modules). `flops_forward` is the main model's (what
  inference runs); `mtp_flops_forward` is what the modules add to a training forward per token (each depth: its
  projection, one block, the shared head), and `flops_train` = 3 × (flops_forward + mtp_flops_forward).
- Per-layer variation (model.layers): every figure is a sum over layers, each with its own components;
  `by_block` gives each distinct block configuration with its layers.
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
    buffer_elements: int = 0  # non-persistent buffers (position tables), not parameters
    by_block: list[dict[str, Any]] = field(default_factory=list)  # per distinct block configuration (per layer group)
    kv_cache_bytes_per_sequence: int = 0  # one sequence at context_length, each layer's real cache
    attention_keys: float = 0.0  # mean keys per query at seq_len, averaged over layers (each pattern's exact sum / T)
    # multi-token prediction (model.mtp): its modules' parameters (in total/active too) and forward FLOPs per token
    mtp_params: int = 0
    mtp_active: int = 0
    mtp_flops_forward: int = 0

    @property
    def main_total(self) -> int:
        """Parameters inference keeps: all but the MTP modules."""
        return self.total - self.mtp_params

    @property
    def main_active(self) -> int:
        return self.active - self.mtp_active

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": {
                "total": self.total,
                "active": self.active,
                "embedding": self.embedding,
                "by_component": dict(self.by_component),
                # per layer group (distinct block configuration), figures per layer; only when layers differ
                **({"by_layer_group": [dict(b) for b in self.by_block]} if len(self.by_block) > 1 else {}),
            },
            "flops_per_token": {"forward": self.flops_forward, "train": self.flops_train,
                                # forward attention scores·values (QKᵀ, AV) at the pattern's exact key count
                                "attention": self.flops_by_component.get("attention_scores", 0)},
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "kv_cache_bytes_per_sequence": self.kv_cache_bytes_per_sequence,
            # the main model and the multi-token prediction modules apart (only with model.mtp)
            **({"mtp": {"params": self.mtp_params, "active": self.mtp_active,
                        "flops_forward_per_token": self.mtp_flops_forward},
                "main": {"params": self.main_total, "active": self.main_active,
                         "flops_forward_per_token": self.flops_forward}} if self.mtp_params else {}),
        }


def param_breakdown(m: ModelSpec) -> tuple[dict[str, int], int]:
    """Parameters by component (summed over layers, each layer with its own components) and the active total."""
    d = m.d_model
    blocks = m.blocks()
    # Each layer's token mixer under its own column (attention; conv; ...); "attention" shown unless no layer attends.
    mixers: dict[str, int] = {"attention": 0} if any(b.token_mixer is b.attention for b in blocks) else {}
    for b in blocks:
        mixer = b.token_mixer
        mixers[type(mixer).component] = mixers.get(type(mixer).component, 0) + mixer.mixer_params(m)
    parts = {
        "embedding": m.vocab_size * d,
        "position": m.attention.positional.params(m),
        **mixers,
        "ffn": sum(b.ffn.params(d) for b in blocks),
        # each block's norms (two, pre- or post-norm; four, sandwich; one, a shared-norm parallel block), the final
        # norm and the embeddings' norm
        "norm": sum(b.n_norms * b.norm.params(d) for b in blocks)
        + m.norm.params(d) * (int(m.final_norm) + int(m.embedding_norm)),
        "lm_head": (0 if m.tie_embeddings else m.vocab_size * d) + (m.vocab_size if m.lm_head_bias else 0),
        # media input (model.media): the gated cross-attention layers and the resampler, under their own columns
        **(m.media.params(m) if m.media is not None else {}),
    }
    parts = {k: v for k, v in parts.items() if v or k in ("embedding", *mixers, "ffn", "norm")}
    active = sum(parts.values()) - sum(b.ffn.params(d) - b.ffn.active_params(d) for b in blocks)
    return parts, active


def mtp_breakdown(m: ModelSpec, seq_len: int, full_attention: bool = False) -> tuple[int, int, int]:
    """(params, active params, forward FLOPs per token) of the multi-token prediction modules: per depth two input
    norms, the 2·d_model → d_model projection, one block like the last layer's and its norm before the shared head
    (whose FLOPs it adds again: each depth scores every position). Zeros without model.mtp."""
    if m.mtp is None:
        return 0, 0, 0
    d = m.d_model
    last = block_breakdown_of(m, m.blocks()[-1], seq_len, full_attention)
    own = 3 * m.norm.params(d) + 2 * d * d
    flops = 2 * (2 * d) * d + last["flops_forward"] + 2 * d * m.vocab_size
    return m.mtp.depth * (own + last["params"]), m.mtp.depth * (own + last["active"]), m.mtp.depth * flops


def flops_breakdown(m: ModelSpec, seq_len: int, full_attention: bool = False) -> dict[str, int]:
    d, blocks = m.d_model, m.blocks()
    mixers: dict[str, float] = {}  # by the columns each mixer names (attention: projections, scores·values)
    for b in blocks:
        for column, flops in b.token_mixer.mixer_flops(m, seq_len, full_attention).items():
            mixers[column] = mixers.get(column, 0) + flops
    return {
        # exact as a rational (each pattern's mean key count), rounded once at the end
        **{column: round(flops) for column, flops in mixers.items()},
        "ffn": sum(b.ffn.flops(d) for b in blocks),
        "lm_head": 2 * d * m.vocab_size,
        # media input: per text token at seq_len, max_items items (their keys, values and resampling shared)
        **({k: round(v) for k, v in m.media.flops(m, seq_len).items()} if m.media is not None else {}),
    }


def block_breakdown(m: ModelSpec, seq_len: int, full_attention: bool = False) -> list[dict[str, Any]]:
    """Per distinct block configuration: its layers and what one such layer costs (params, active params, forward
    FLOPs per token at `seq_len`, KV-cache elements per token)."""
    return [{"layers": layers, **block_breakdown_of(m, block, seq_len, full_attention)}
            for block, layers in m.block_groups()]


def block_breakdown_of(m: ModelSpec, block: Any, seq_len: int, full_attention: bool = False) -> dict[str, Any]:
    """What one layer of `block`'s configuration costs (see block_breakdown)."""
    d = m.d_model
    a = block.token_mixer
    norms = block.n_norms * block.norm.params(d)
    return {
        # the mixer's words under its own column (attention, conv) and under "mixer", whatever its kind
        "norm": block.norm.describe(m), type(a).component: a.summary(m), "mixer": a.summary(m),
        "ffn": block.ffn.describe(m),
        "params": a.mixer_params(m) + block.ffn.params(d) + norms,
        "active": a.mixer_params(m) + block.ffn.active_params(d) + norms,
        "flops_forward": round(sum(a.mixer_flops(m, seq_len, full_attention).values()) + block.ffn.flops(d)),
        # decoding state per token that grows with the context (a fixed conv state: 0), in elements
        "kv_elements_per_token": a.state_bytes_per_token(m, 1),
    }


def attention_keys(m: ModelSpec, seq_len: int, full_attention: bool = False) -> float:
    """Mean number of keys each query attends to (see the module docstring)."""
    if full_attention:
        return float(seq_len)
    # each attention layer's own pattern (per-layer variation), averaged over the layers that attend
    keys = [float(b.attention.sparsity.keys(seq_len)) for b in m.blocks() if b.token_mixer is b.attention]
    return sum(keys) / len(keys) if keys else 0.0


def kv_cache_bytes_per_token(m: ModelSpec, dtype: str = "bf16") -> int:
    """Bytes the decoding state grows by per position (KV caches; a fixed conv state adds none)."""
    return sum(b.token_mixer.state_bytes_per_token(m, BYTES_PER_ELEMENT[dtype]) for b in m.blocks())


def kv_cache_bytes(m: ModelSpec, seq_len: int, dtype: str = "bf16", batch_size: int = 1) -> int:
    """Bytes of the KV cache `batch_size` sequences of `seq_len` tokens need, each layer's cache as its attention
    pattern keeps it (dense: every position; a window: at most its window, a ring buffer). Equals the generated model's
    `sum(c.nbytes for c in model.new_cache(batch_size, seq_len))` at that dtype (tested)."""
    per_sequence = sum(b.token_mixer.state_bytes_per_sequence(m, seq_len, BYTES_PER_ELEMENT[dtype]) for b in m.blocks())
    if m.media is not None:  # the media's keys and values in each cross-attention layer, made once per sequence
        per_sequence += m.media.state_bytes_per_sequence(m, seq_len, BYTES_PER_ELEMENT[dtype])
    return batch_size * per_sequence


def kv_cache_bytes_per_sequence(m: ModelSpec, dtype: str = "bf16") -> int:
    """One sequence at context_length, each layer's cache as its attention pattern needs it."""
    return kv_cache_bytes(m, m.context_length, dtype)


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
    mtp_params, mtp_active, mtp_flops = mtp_breakdown(m, seq_len, full_attention)
    if mtp_params:
        parts["mtp"] = mtp_params
    return Accounting(
        total=sum(parts.values()),
        active=active + mtp_active,
        mtp_params=mtp_params, mtp_active=mtp_active, mtp_flops_forward=mtp_flops,
        embedding=parts["embedding"] + parts.get("position", 0),
        by_component=parts,
        flops_forward=forward,
        flops_train=3 * (forward + mtp_flops),
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(m, kv_dtype),
        kv_cache_bytes_per_sequence=kv_cache_bytes_per_sequence(m, kv_dtype),
        attention_keys=attention_keys(m, seq_len, full_attention),
        seq_len=seq_len,
        flops_by_component=flops,
        buffer_elements=sum(u.buffer_elements(m) for u in m.units()),
        by_block=block_breakdown(m, seq_len, full_attention),
    )
