"""The spec language: pydantic models for a decoder-only transformer and its training recipe.

Every variant is a member of a discriminated union on `kind` and holds only its own fields. A new kind (a MoE FFN,
a sparse attention pattern) is one more class added to its union here, one more template branch, and one more
accounting term; nothing existing changes shape.

Field-level checks live on the fields; rules that relate several fields live in `archspec.spec.rules` so that each
problem is reported with its own field path.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from archspec.spec.kinds import Strict, kind_union

from archspec.spec.train import TrainSpec

# Hard bounds: large enough for any real model (accounting works on a 1T-parameter spec), small enough that a typo
# such as an extra zero gives a clear message instead of an allocation failure deep inside torch.
MAX_VOCAB = 1 << 20
MAX_CONTEXT = 1 << 20
MAX_WIDTH = 1 << 16  # d_model
MAX_HIDDEN = 1 << 20  # FFN hidden size
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024

SLUG = r"^[a-z0-9][a-z0-9_-]{0,63}$"


# ── norms ────────────────────────────────────────────────────────────────────────────────────────────────────────


class LayerNormSpec(Strict):
    kind: Literal["layernorm"] = "layernorm"
    eps: float = Field(1e-5, gt=0, le=0.1)
    bias: bool = True  # GPT-2 LayerNorm has a bias; set false for the bias-free variant


class RMSNormSpec(Strict):
    kind: Literal["rmsnorm"] = "rmsnorm"
    eps: float = Field(1e-5, gt=0, le=0.1)


Norm = kind_union(LayerNormSpec, RMSNormSpec, default="rmsnorm")


# ── positional encodings ─────────────────────────────────────────────────────────────────────────────────────────


class LearnedPositional(Strict):
    kind: Literal["learned"] = "learned"  # a trained (context_length, d_model) table, as in GPT-2


class SinusoidalPositional(Strict):
    kind: Literal["sinusoidal"] = "sinusoidal"  # fixed table from "Attention Is All You Need", added to embeddings
    base: float = Field(10000.0, gt=1.0, le=1e9)
    # The paper multiplies token embeddings by sqrt(d_model) before adding the table; without it, N(0, 0.02)
    # embeddings are swamped by the table's unit-amplitude sinusoids (measured: docs/ABLATIONS.md).
    scale_embeddings: bool = True


class RopePositional(Strict):
    kind: Literal["rope"] = "rope"  # rotary embeddings applied to q and k in every layer (RoFormer, LLaMA)
    theta: float = Field(10000.0, gt=1.0, le=1e9)


class NoPositional(Strict):
    kind: Literal["none"] = "none"  # NoPE: causal masking alone carries position


Positional = kind_union(LearnedPositional, SinusoidalPositional, RopePositional, NoPositional, default="rope")


# ── attention sparsity (sliding_window, global_local, block_sparse join this union) ─────────────────────────────


class DenseSparsity(Strict):
    kind: Literal["dense"] = "dense"  # full causal attention


Sparsity = kind_union(DenseSparsity, default="dense")


class AttentionSpec(Strict):
    n_heads: int = Field(8, ge=1, le=MAX_HEADS)
    n_kv_heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="= n_heads: MHA; 1: MQA; between: GQA")
    head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM, description="default d_model // n_heads")
    bias: bool = False
    positional: Positional = Field(default_factory=RopePositional)
    sparsity: Sparsity = Field(default_factory=DenseSparsity)


# ── feed-forward (moe joins this union) ──────────────────────────────────────────────────────────────────────────


class MLPSpec(Strict):
    kind: Literal["mlp"] = "mlp"  # up → activation → down
    activation: Literal["relu", "gelu", "silu"] = "gelu"
    hidden_dim: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="default 4 · d_model")
    bias: bool = True


class GLUSpec(Strict):
    kind: Literal["glu"] = "glu"  # down(act(gate(x)) * up(x)): silu = SwiGLU, gelu = GEGLU, relu = ReGLU, sigmoid = GLU
    activation: Literal["silu", "gelu", "relu", "sigmoid"] = "silu"
    hidden_dim: int | None = Field(
        None, ge=1, le=MAX_HIDDEN, description="default 8/3 · d_model rounded up to a multiple of 32 (LLaMA)"
    )
    bias: bool = False


FFN = kind_union(MLPSpec, GLUSpec, default="glu")


# ── the model and the whole spec ─────────────────────────────────────────────────────────────────────────────────


class ModelSpec(Strict):
    vocab_size: int = Field(8192, ge=2, le=MAX_VOCAB)
    context_length: int = Field(1024, ge=1, le=MAX_CONTEXT)
    d_model: int = Field(512, ge=1, le=MAX_WIDTH)
    n_layers: int = Field(8, ge=1, le=MAX_LAYERS)
    norm: Norm = Field(default_factory=RMSNormSpec)
    attention: AttentionSpec = Field(default_factory=AttentionSpec)
    ffn: FFN = Field(default_factory=GLUSpec)
    tie_embeddings: bool = True
    dropout: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _fill_derived_defaults(self) -> "ModelSpec":
        # Defaults that depend on other fields are written into the spec, so that writing them explicitly gives the
        # same canonical JSON (and hash). Inconsistent values are left alone for archspec.spec.rules to report.
        att = self.attention
        if att.n_kv_heads is None:
            object.__setattr__(att, "n_kv_heads", att.n_heads)
        if att.head_dim is None and self.d_model % att.n_heads == 0:
            object.__setattr__(att, "head_dim", self.d_model // att.n_heads)
        if self.ffn.hidden_dim is None:
            object.__setattr__(self.ffn, "hidden_dim", default_hidden_dim(self.ffn.kind, self.d_model))
        return self


def default_hidden_dim(kind: str, d_model: int) -> int:
    if kind == "glu":
        # 2/3 of 4·d keeps GLU's three matrices at the parameter count of a 4·d MLP's two (LLaMA); rounded up to a
        # multiple of 32 for matmul-friendly shapes (d_model 512 → 1376).
        return min(MAX_HIDDEN, -(-(8 * d_model) // (3 * 32)) * 32)
    return min(MAX_HIDDEN, 4 * d_model)


class Spec(Strict):
    name: str = Field(pattern=SLUG, description="slug: lowercase letters, digits, '-' and '_'")
    model: ModelSpec = Field(default_factory=ModelSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)

    @model_validator(mode="after")
    def _fill_train_defaults(self) -> "Spec":
        if self.train.seq_len is None:
            object.__setattr__(self.train, "seq_len", self.model.context_length)
        tok = self.train.data.tokenizer
        if tok.kind == "bpe" and tok.vocab_size is None:
            object.__setattr__(tok, "vocab_size", self.model.vocab_size)
        return self
