"""LFM2's gated short convolution (Liquid AI, 2025), a token mixer with no attention: in_proj to B, C and x (three
D_MODEL-wide parts of one matmul), Bx = B·x, a depthwise causal conv of kernel L_cache over Bx, y = C·conv(Bx),
out_proj. It sees the last L_cache positions only, through the conv: no positions, no sparsity pattern, and a
decoding state of a fixed L_cache - 1 positions however long the sequence (archspec.runtime.ConvCache)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from archspec.kinds.base import Const, MixerKind, lit_bool, lit_int, register
from archspec.kinds.hf import HFWeight, linear

MAX_L_CACHE = 256


@register
class ShortConvSpec(MixerKind):
    kind: Literal["short_conv"] = "short_conv"
    prefix = "ShortConv"
    L_cache: int = Field(3, ge=2, le=MAX_L_CACHE, description="the conv's kernel: positions each output reads, its "
                         "own included (LFM2: 3); the decoding state keeps L_cache - 1")
    bias: bool = Field(False, description="biases on in_proj, the conv and out_proj (LFM2's conv_bias)")

    attribute: ClassVar[str] = "conv"  # blocks.N.conv.in_proj.weight, as LFM2 names the module
    component: ClassVar[str] = "conv"
    base_class: ClassVar[str] = "ShortConv"
    section: ClassVar[str] = "short convolution"

    # ── the mixer contract ──
    def mixer_params(self, m: Any) -> int:
        d = m.d_model
        return 3 * d * d + d * self.L_cache + d * d + ((3 * d + d + d) if self.bias else 0)

    def mixer_flops(self, m: Any, seq_len: int, full_attention: bool = False) -> dict[str, float]:
        d = m.d_model  # in_proj (D → 3D), the depthwise conv (L_cache taps per channel), out_proj (D → D)
        return {"conv": 2 * (3 * d * d + d * self.L_cache + d * d)}

    def state_bytes_per_token(self, m: Any, element_bytes: int) -> int:
        return 0  # a fixed state: it does not grow with the context

    def state_bytes_per_sequence(self, m: Any, seq_len: int, element_bytes: int) -> int:
        return m.d_model * (self.L_cache - 1) * element_bytes  # the conv input's last L_cache - 1 positions

    def saved_bytes(self, m: Any, seq_len: int, mm: int, device: str) -> int:
        # in_proj's output (B, C, x: alive as views), the conv's input B·x, its output, and out_proj's input C·conv
        return 6 * m.d_model * mm

    @property
    def cache_class(self) -> str:
        return "ConvCache"

    def max_lookback(self) -> int | None:
        return self.L_cache

    def quantized_weights(self, module: Any) -> list[str]:
        return ["in_proj.weight", "out_proj.weight"]  # the conv's taps are a few numbers per channel: kept

    def describe(self, m: Any) -> str:
        return f"gated short conv (kernel {self.L_cache})"

    def class_label(self) -> str:
        return ""

    def constants(self, m: Any) -> list[Const]:
        return [Const("L_CACHE", lit_int(self.L_cache), "the short conv's kernel: positions each output reads"),
                Const("CONV_BIAS", lit_bool(self.bias), "biases on in_proj, the conv and out_proj")]

    # ── HF transformers interop (LFM2's Lfm2ShortConv) ──
    hf_block = "conv"  # LFM2's word for it (layer_types)

    @classmethod
    def from_hf(cls, cfg) -> dict[str, Any]:
        return {"kind": cls.model_fields["kind"].default, "L_cache": cfg.take("conv_L_cache", int), "bias": cfg.take("conv_bias", bool)}

    def to_hf(self, m: Any, out: dict[str, Any], hf: Any, path: tuple[str, ...] = ()) -> None:
        out[hf.keys["conv_L_cache"]] = self.L_cache
        out[hf.keys["conv_bias"]] = self.bias

    def hf_weights(self, m: Any, hf: Any) -> list[HFWeight]:
        return [*linear("in_proj", "in_proj", self.bias, False), *linear("conv", "conv", self.bias, False),
                *linear("out_proj", "out_proj", self.bias, False)]
