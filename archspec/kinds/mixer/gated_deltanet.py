"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2024), the linear attention of Qwen3-Next and Qwen3.5: q, k and v from
one projection through a short causal conv (SiLU), q and k L2-normalised, a decay α = exp(−exp(A_log)·softplus(a +
dt_bias)) and a write strength β = sigmoid(b) per value head, the gated delta rule over a K_DIM × V_DIM state per
head (archspec.runtime.linear_attention), a gated RMSNorm (normalise, then × silu(z)) and the output projection. No
positions (order reaches it through the conv and the decay), no sparsity pattern, and a decoding state of a fixed
size however long the sequence (archspec.runtime.DeltaRuleCache).

Its init is the Gated DeltaNet paper's (flash-linear-attention's, as Mamba-2's): A ~ U(0, 16) and dt log-uniform in
[1e-3, 0.1] through dt_bias = softplus⁻¹(dt), so that α starts near 1. transformers' Qwen3-Next init (dt_bias = 1)
starts almost every head at α ≤ 0.3, a memory of a position or two, from which a model trained on MQAR stayed at
chance (docs/mixers.md); imported weights replace either."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, ClassVar, Literal

from pydantic import Field

from archspec.kinds.base import EPS_MIN, Const, MixerKind, TPPlan, lit_float, lit_int, register
from archspec.kinds.hf import HFWeight, linear
from archspec.kinds.limits import MAX_HEAD_DIM, MAX_HEADS

MAX_CONV = 256
MAX_CHUNK = 1024


@register
class GatedDeltaNetSpec(MixerKind):
    kind: Literal["gated_deltanet"] = "gated_deltanet"
    prefix = "GatedDeltaNet"
    n_heads: int = Field(4, ge=1, le=MAX_HEADS, description="value heads, each with its own head_k_dim × head_v_dim "
                         "state (Qwen3-Next's linear_num_value_heads)")
    n_k_heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="query/key heads, each serving n_heads / "
                                  "n_k_heads value heads (linear_num_key_heads); default n_heads")
    head_k_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM, description="width of each q/k head; default "
                                   "d_model // n_k_heads")
    head_v_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM, description="width of each value head; default "
                                   "head_k_dim")
    conv_kernel: int = Field(4, ge=2, le=MAX_CONV, description="the short causal conv over q, k, v: positions each "
                             "output reads, its own included (linear_conv_kernel_dim)")
    chunk_size: int = Field(64, ge=1, le=MAX_CHUNK, description="positions per chunk of the chunked training form "
                            "(its FLOPs and memory; not the function it computes)")
    norm_eps: float = Field(1e-6, ge=EPS_MIN, le=0.1, description="the gated output RMSNorm's eps")

    attribute: ClassVar[str] = "linear_attn"  # blocks.N.linear_attn.in_proj_qkvz.weight, as Qwen3-Next names it
    component: ClassVar[str] = "linear_attention"
    base_class: ClassVar[str] = "GatedDeltaNet"
    section: ClassVar[str] = "gated deltanet"

    def fill_defaults(self, m: Any) -> None:
        if self.n_k_heads is None:
            object.__setattr__(self, "n_k_heads", self.n_heads)
        if self.head_k_dim is None and m.d_model % self.n_k_heads == 0 and m.d_model // self.n_k_heads <= MAX_HEAD_DIM:
            object.__setattr__(self, "head_k_dim", m.d_model // self.n_k_heads)
        if self.head_v_dim is None and self.head_k_dim is not None:
            object.__setattr__(self, "head_v_dim", self.head_k_dim)

    def problems(self, m: Any, path: tuple[str, ...]) -> list:
        out = []
        if self.n_k_heads is not None and (self.n_k_heads > self.n_heads or self.n_heads % self.n_k_heads):
            out.append((path + ("n_k_heads",), f"must divide n_heads ({self.n_heads}), got {self.n_k_heads}",
                        self.n_k_heads))
        elif self.head_k_dim is None:
            out.append((path + ("n_k_heads",), f"must divide d_model ({m.d_model}) into heads of at most "
                        f"{MAX_HEAD_DIM} when head_k_dim is not given, got {self.n_k_heads}; set head_k_dim",
                        self.n_k_heads))
        return out

    # ── shapes ──
    @property
    def key_width(self) -> int:
        return self.n_k_heads * self.head_k_dim

    @property
    def value_width(self) -> int:
        return self.n_heads * self.head_v_dim

    @property
    def conv_width(self) -> int:
        return 2 * self.key_width + self.value_width  # q, k, v go through the conv; z does not

    # ── the mixer contract ──
    def mixer_params(self, m: Any) -> int:
        d = m.d_model
        return (d * (2 * self.key_width + 2 * self.value_width) + d * 2 * self.n_heads  # in_proj_qkvz, in_proj_ba
                + self.conv_width * self.conv_kernel + 2 * self.n_heads + self.head_v_dim  # conv, A_log, dt_bias, norm
                + self.value_width * d)  # out_proj

    def scan_flops(self, seq_len: int) -> Fraction:
        """Matmul FLOPs per token of the chunked gated delta rule over `seq_len` positions (padded to whole chunks):
        per value head and chunk of C, 2·C²·K twice (the chunk's β-weighted KKᵀ and QKᵀ), C·(C − 1)·(V + K) for the two
        unit-triangular solves, 2·C·K·V three times (W·S, Q·S, Kᵀ·V') and 2·C²·V ((QKᵀ ⊙ D)·V')
        (archspec.runtime.linear_attention.gated_delta_rule_chunked)."""
        C, K, V = self.chunk_size, self.head_k_dim, self.head_v_dim
        chunks = -(-seq_len // C)
        per_chunk = 4 * C * C * K + C * (C - 1) * (V + K) + 6 * C * K * V + 2 * C * C * V
        return Fraction(self.n_heads * chunks * per_chunk, max(seq_len, 1))

    def mixer_flops(self, m: Any, seq_len: int, full_attention: bool = False) -> dict[str, float]:
        d = m.d_model
        proj = 2 * (d * (2 * self.key_width + 2 * self.value_width) + d * 2 * self.n_heads
                    + self.conv_width * self.conv_kernel + self.value_width * d)
        return {"linear_attention": proj + self.scan_flops(seq_len)}  # its projections and conv, and the chunked rule

    def state_bytes_per_token(self, m: Any, element_bytes: int) -> int:
        return 0  # a fixed state: it does not grow with the context

    def state_bytes_per_sequence(self, m: Any, seq_len: int, element_bytes: int) -> int:
        # the conv input's last conv_kernel - 1 positions, in the model's dtype, and S, always float32
        return self.conv_width * (self.conv_kernel - 1) * element_bytes + self.n_heads * self.head_k_dim * \
            self.head_v_dim * 4

    def saved_bytes(self, m: Any, seq_len: int, mm: int, device: str) -> int:
        # In the matmul dtype: the projections' outputs (qkvz, ba), the conv's input, output and SiLU output, q and k
        # normalised and repeated to the value heads, and the gated norm's input, gate, normalised output, SiLU of
        # the gate and out_proj's input. In float32, the chunked rule's per-token tensors: q, k, v and their β-, decay-
        # weighted copies (≈ 7 key-wide, 5 value-wide per head) and three C-wide rows per head (D, A, QKᵀ), plus g, β.
        h, K, V, C = self.n_heads, self.head_k_dim, self.head_v_dim, self.chunk_size
        in_mm = (2 * self.key_width + 2 * self.value_width) + 2 * h + 3 * self.conv_width + 2 * h * K + 5 * h * V
        in_fp32 = h * (7 * K + 5 * V + 3 * C + 4)
        return in_mm * mm + in_fp32 * 4

    @property
    def cache_class(self) -> str:
        return "DeltaRuleCache"

    def tensor_parallel(self, m: Any) -> TPPlan:
        return TPPlan(refused=((), "a gated_deltanet layer has no tensor-parallel plan yet (its depthwise conv over "
                               "q, k, v and its fused per-key-head projections are not split by torch's colwise "
                               "style); use train.parallel.tp: 1, or FSDP"))

    def decode_compile_refusal(self, m: Any) -> str | None:
        return ("a gated_deltanet layer's decoding state keeps Python-side snapshots for speculative rollback and "
                "switches between the chunked and the one-step form by length")

    def quantized_weights(self, module: Any) -> list[str]:
        return ["in_proj_qkvz.weight", "in_proj_ba.weight", "out_proj.weight"]  # conv taps, A, dt, norm: kept

    def describe(self, m: Any) -> str:
        return (f"Gated DeltaNet ({self.n_heads} value heads, {self.n_k_heads} q/k heads, state "
                f"{self.head_k_dim}×{self.head_v_dim}, conv {self.conv_kernel})")

    def constants(self, m: Any) -> list[Const]:
        r = self.n_heads // self.n_k_heads
        return [Const("GDN_HEADS", lit_int(self.n_heads), "value heads, each its own GDN_K_DIM × GDN_V_DIM state"),
                Const("GDN_K_HEADS", lit_int(self.n_k_heads), "query/key heads" + (
                    f", each serving {r} value heads" if r > 1 else " (one per value head)")),
                Const("GDN_K_DIM", lit_int(self.head_k_dim)),
                Const("GDN_V_DIM", lit_int(self.head_v_dim)),
                Const("GDN_CONV", lit_int(self.conv_kernel), "the short causal conv over q, k, v: positions it reads"),
                Const("GDN_CHUNK", lit_int(self.chunk_size), "positions per chunk of the chunked training form"),
                Const("GDN_NORM_EPS", lit_float(self.norm_eps), "the gated output norm's eps")]

    # ── testing ──
    @classmethod
    def strategy(cls, ctx):
        from hypothesis import strategies as st

        @st.composite
        def draw(draw):
            n_k = draw(st.integers(1, 2))
            return {"n_heads": n_k * draw(st.integers(1, 2)), "n_k_heads": n_k, "head_k_dim": draw(st.integers(1, 8)),
                    "head_v_dim": draw(st.integers(1, 8)), "conv_kernel": draw(st.integers(2, 4)),
                    "chunk_size": draw(st.integers(1, 16))}

        return draw()

    # ── HF transformers interop (Qwen3-Next's Qwen3NextGatedDeltaNet) ──
    hf_block = "linear_attention"  # Qwen3-Next's word for it (layer_types)

    @classmethod
    def from_hf(cls, cfg) -> dict[str, Any]:
        return {"kind": cls.model_fields["kind"].default, "n_heads": cfg.take("linear_num_value_heads", int),
                "n_k_heads": cfg.take("linear_num_key_heads", int), "head_k_dim": cfg.take("linear_key_head_dim", int),
                "head_v_dim": cfg.take("linear_value_head_dim", int),
                "conv_kernel": cfg.take("linear_conv_kernel_dim", int), "norm_eps": cfg.take("norm_eps", float)}

    def to_hf(self, m: Any, out: dict[str, Any], hf: Any, path: tuple[str, ...] = ()) -> None:
        from archspec.kinds.hf import HFUnsupported

        for key, value in (("linear_num_value_heads", self.n_heads), ("linear_num_key_heads", self.n_k_heads),
                           ("linear_key_head_dim", self.head_k_dim), ("linear_value_head_dim", self.head_v_dim),
                           ("linear_conv_kernel_dim", self.conv_kernel)):
            out[hf.keys[key]] = value
        if not math.isclose(self.norm_eps, out.get(hf.keys["norm_eps"], self.norm_eps)):
            raise HFUnsupported(f"{'.'.join((*path, 'norm_eps'))}: {self.norm_eps} cannot be expressed as "
                                f"{hf.model_type} (its gated norm uses {hf.keys['norm_eps']}, here "
                                f"{out.get(hf.keys['norm_eps'])})")

    def hf_weights(self, m: Any, hf: Any) -> list[HFWeight]:
        # the module follows Qwen3NextGatedDeltaNet's layout (in_proj_qkvz's rows grouped per key head): one to one
        return [*linear("in_proj_qkvz", "in_proj_qkvz", False, False),
                *linear("in_proj_ba", "in_proj_ba", False, False),
                HFWeight("conv1d.weight", ("conv1d.weight",)), HFWeight("dt_bias", ("dt_bias",)),
                HFWeight("A_log", ("A_log",)), HFWeight("norm.weight", ("norm.weight",)),
                *linear("out_proj", "out_proj", False, False)]
