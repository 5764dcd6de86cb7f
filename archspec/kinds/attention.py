"""The attention unit: projections, K/V head sharing (MHA/GQA/MQA), biases, and the two families it holds:
`positional` (how positions reach q and k) and `sparsity` (which keys each query sees). Its template,
attention.py.j2, is the one Attention module; the families' hook macros fill it in."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from archspec.kinds.base import Const, Strict, bind, family, lit_bool, lit_int
from archspec.kinds.limits import MAX_HEAD_DIM, MAX_HEADS

Positional = family("positional").union()
Sparsity = family("sparsity").union()


class AttentionSpec(Strict):
    n_heads: int = Field(8, ge=1, le=MAX_HEADS)
    n_kv_heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="= n_heads: MHA; 1: MQA; between: GQA")
    head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM, description="default d_model // n_heads")
    bias: bool = False
    qkv_bias: bool | None = Field(None, description="bias on the q/k/v projections (default: bias)")
    out_bias: bool | None = Field(None, description="bias on the output projection (default: bias)")
    positional: Positional = Field(default_factory=lambda: family("positional").members["rope"]())
    sparsity: Sparsity = Field(default_factory=lambda: family("sparsity").members["dense"]())

    def fill_defaults(self, d_model: int) -> None:
        # Written into the spec so that the explicit and the omitted forms hash alike. `bias` is then normalised to
        # "both projections have a bias", so {bias: true} and {qkv_bias: true, out_bias: true} are one model.
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None and d_model % self.n_heads == 0:
            object.__setattr__(self, "head_dim", d_model // self.n_heads)
        if self.qkv_bias is None:
            object.__setattr__(self, "qkv_bias", self.bias)
        if self.out_bias is None:
            object.__setattr__(self, "out_bias", self.bias)
        object.__setattr__(self, "bias", bool(self.qkv_bias and self.out_bias))

    # ── accounting ──
    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    def params(self, d_model: int) -> int:
        weights = d_model * self.q_width + 2 * d_model * self.kv_width + self.q_width * d_model
        biases = (self.q_width + 2 * self.kv_width if self.qkv_bias else 0) + (d_model if self.out_bias else 0)
        return weights + biases

    def projection_flops(self, d_model: int) -> int:
        return 2 * (d_model * self.q_width + 2 * d_model * self.kv_width + self.q_width * d_model)

    def score_flops(self, seq_len: int, full_attention: bool = False) -> float:
        """QKᵀ and AV per token: each 2 · head_dim · keys per query head (keys: the pattern's mean key count)."""
        keys = float(seq_len) if full_attention else self.sparsity.keys(seq_len)
        return 2 * 2 * self.n_heads * self.head_dim * keys

    def kv_cache_elements_per_token(self) -> int:
        return 2 * self.n_kv_heads * self.head_dim  # K and V

    # ── codegen ──
    @property
    def layout(self) -> str:
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    def constants(self, m: Any) -> list[Const]:
        return [
            Const("N_HEADS", lit_int(self.n_heads), "query heads"),
            Const("N_KV_HEADS", lit_int(self.n_kv_heads), {
                "MHA": "= N_HEADS: multi-head attention",
                "MQA": "1: multi-query attention, one K/V head for all queries",
                "GQA": f"grouped-query attention, {self.n_heads // self.n_kv_heads} query heads per K/V head",
            }[self.layout]),
            Const("HEAD_DIM", lit_int(self.head_dim)),
            Const("QKV_BIAS", lit_bool(self.qkv_bias), "bias on the q, k, v projections"),
            Const("OUT_BIAS", lit_bool(self.out_bias), "bias on the output projection"),
        ]

    def template_context(self, m: Any) -> dict[str, Any]:
        return {"layout": self.layout, "gqa": self.n_kv_heads != self.n_heads,
                "qkv_bias": bool(self.qkv_bias), "out_bias": bool(self.out_bias)}


bind("positional", AttentionSpec, "positional")
bind("sparsity", AttentionSpec, "sparsity")
