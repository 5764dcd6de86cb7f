"""Mamba-2 (Dao & Gu, 2024, "Transformers are SSMs"), a state-space token mixer as transformers' Mamba2Mixer defines
it: in_proj to z (the gate), x, B, C and dt (one matmul); a depthwise causal conv (kernel conv_kernel) and silu over
x, B and C; per head a decay A = -exp(A_log), a step dt = softplus(dt + dt_bias) and a skip D; the selective scan in
its chunked form (SSD); a gated RMSNorm (× silu(z) first, then normalised per group of n_groups) and out_proj.

No positions, no sparsity pattern: order reaches it through the conv and the scan. Its decoding state is fixed,
however long the sequence: the conv input's last conv_kernel - 1 positions and the scan's state (heads, head_dim,
d_state) in float32 (archspec.runtime.SSMCache). The kernels are archspec.runtime.ssd's."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from archspec.kinds.base import EPS_MIN, Const, MixerKind, lit_bool, lit_float, lit_int, register
from archspec.kinds.hf import HFWeight, linear
from archspec.kinds.limits import MAX_HEAD_DIM

MAX_STATE = 1024
MAX_KERNEL = 64
MAX_CHUNK = 4096
STATE_BYTES = 4  # the scan's state is kept in float32 whatever the model's dtype (its decays compound)


@register
class Mamba2Spec(MixerKind):
    kind: Literal["mamba2"] = "mamba2"
    prefix = "Mamba2"
    expand: int = Field(2, ge=1, le=16, description="the inner width is expand · d_model (Mamba-2: 2)")
    head_dim: int = Field(64, ge=1, le=MAX_HEAD_DIM, description="channels per head (P); heads = expand · d_model / "
                          "head_dim, so it must divide expand · d_model")
    d_state: int = Field(128, ge=1, le=MAX_STATE, description="the state size per channel (N; Mamba-2: 64 or 128)")
    n_groups: int = Field(1, ge=1, le=1024, description="groups of heads sharing B and C (and the gated norm's "
                          "groups); must divide the heads")
    conv_kernel: int = Field(4, ge=2, le=MAX_KERNEL, description="the causal conv's kernel over x, B, C")
    chunk_size: int = Field(256, ge=1, le=MAX_CHUNK, description="positions per chunk of the chunked scan (a "
                            "speed/memory choice: the function is the same)")
    conv_bias: bool = Field(True, description="a bias on the conv (Mamba-2: true)")
    bias: bool = Field(False, description="biases on in_proj and out_proj (Mamba-2: false)")
    norm_eps: float = Field(1e-5, ge=EPS_MIN, le=1.0, description="epsilon of the gated RMSNorm")

    attribute: ClassVar[str] = "ssm"  # blocks.N.ssm.in_proj.weight (transformers: layers.N.mixer, its role word)
    component: ClassVar[str] = "ssm"
    base_class: ClassVar[str] = "Mamba2"
    section: ClassVar[str] = "state-space mixer (Mamba-2)"

    # ── shapes ──
    def d_inner(self, m: Any) -> int:
        return self.expand * m.d_model

    def n_heads(self, m: Any) -> int:
        return self.d_inner(m) // self.head_dim

    def conv_dim(self, m: Any) -> int:
        return self.d_inner(m) + 2 * self.n_groups * self.d_state  # x, B, C go through the conv

    def problems(self, m: Any, path: tuple[str, ...]) -> list:
        di = self.d_inner(m)
        if di % self.head_dim:
            return [(path + ("head_dim",), f"must divide the inner width expand · d_model ({di}), got "
                     f"{self.head_dim}", self.head_dim)]
        heads = di // self.head_dim
        if heads % self.n_groups:
            return [(path + ("n_groups",), f"must divide the heads (expand · d_model / head_dim = {heads}), got "
                     f"{self.n_groups}", self.n_groups)]
        return []

    # ── the mixer contract ──
    def mixer_params(self, m: Any) -> int:
        d, di, h, cd = m.d_model, self.d_inner(m), self.n_heads(m), self.conv_dim(m)
        proj = d * (di + cd + h) + di * d + ((di + cd + h) + d if self.bias else 0)  # in_proj (z, xBC, dt), out_proj
        conv = cd * self.conv_kernel + (cd if self.conv_bias else 0)
        return proj + conv + 3 * h + di  # dt_bias, A_log, D per head; the gated norm's gain

    def mixer_flops(self, m: Any, seq_len: int, full_attention: bool = False) -> dict[str, float]:
        from archspec.runtime.ssd import ssd_flops

        d, di, h, cd = m.d_model, self.d_inner(m), self.n_heads(m), self.conv_dim(m)
        return {"ssm": 2 * (d * (di + cd + h) + cd * self.conv_kernel + di * d),  # in_proj, the conv, out_proj
                "ssm_scan": ssd_flops(seq_len, self.chunk_size, h, self.head_dim, self.d_state, self.n_groups)}

    def state_bytes_per_token(self, m: Any, element_bytes: int) -> int:
        return 0  # a fixed state: it does not grow with the context

    def state_bytes_per_sequence(self, m: Any, seq_len: int, element_bytes: int) -> int:
        conv = self.conv_dim(m) * (self.conv_kernel - 1) * element_bytes
        return conv + self.n_heads(m) * self.head_dim * self.d_state * STATE_BYTES

    def saved_bytes(self, m: Any, seq_len: int, mm: int, device: str) -> int:
        from archspec.runtime.ssd import chunking

        di, h, cd, gn = self.d_inner(m), self.n_heads(m), self.conv_dim(m), self.n_groups * self.d_state
        q, n_chunks = chunking(max(seq_len, 1), self.chunk_size)
        pad = n_chunks * q / max(seq_len, 1)  # the last chunk is padded
        # in the matmul dtype: in_proj's output, the conv's output and its silu, out_proj's input
        mm_elems = (di + cd + h) + 2 * cd + di
        # in float32, per padded position: dt, the discretised x, B and C and their per-head copies, the decay mask and
        # the masked scores (Q per head), C·Bᵀ (Q per group), the two output parts, the carried states (H·P·N per
        # chunk); the gated norm's product, its normalised output and its rsqrt
        scan = pad * (h + di + 2 * gn + 2 * h * self.d_state + 2 * h * q + self.n_groups * q + 2 * di
                      + h * self.head_dim * self.d_state / q) + 3 * di
        return int(mm_elems * mm + scan * 4)

    @property
    def cache_class(self) -> str:
        return "SSMCache"

    def quantized_weights(self, module: Any) -> list[str]:
        return ["in_proj.weight", "out_proj.weight"]  # the conv's taps and the per-head A, dt, D stay as trained

    def describe(self, m: Any) -> str:
        return (f"Mamba-2 SSD ({self.n_heads(m)} heads of {self.head_dim}, state {self.d_state}, "
                f"{self.n_groups} group{'s' if self.n_groups > 1 else ''}, conv {self.conv_kernel}, "
                f"chunk {self.chunk_size})")

    def constants(self, m: Any) -> list[Const]:
        return [Const("SSM_D_INNER", lit_int(self.d_inner(m)), f"the inner width: expand ({self.expand}) · D_MODEL"),
                Const("SSM_HEADS", lit_int(self.n_heads(m)), "SSM_D_INNER / SSM_HEAD_DIM"),
                Const("SSM_HEAD_DIM", lit_int(self.head_dim), "channels per head (P)"),
                Const("SSM_STATE", lit_int(self.d_state), "state size per channel (N)"),
                Const("SSM_GROUPS", lit_int(self.n_groups), "groups of heads sharing B and C"),
                Const("SSM_CONV", lit_int(self.conv_kernel), "the causal conv's kernel over x, B, C"),
                Const("SSM_CHUNK", lit_int(self.chunk_size), "positions per chunk of the chunked scan"),
                Const("SSM_CONV_BIAS", lit_bool(self.conv_bias), "a bias on the conv"),
                Const("SSM_BIAS", lit_bool(self.bias), "biases on in_proj and out_proj"),
                Const("SSM_NORM_EPS", lit_float(self.norm_eps), "the gated RMSNorm's epsilon")]

    # ── testing ──
    @classmethod
    def strategy(cls, ctx):
        """Small valid shapes for d_model: head_dim a divisor of expand · d_model, n_groups a divisor of the heads,
        chunks from 1 up, so that sequences both shorter and longer than a chunk, and not multiples of it, occur."""
        from hypothesis import strategies as st

        @st.composite
        def build(draw):
            expand = draw(st.integers(1, 2))
            inner = expand * ctx["d_model"]
            head_dim = draw(st.sampled_from([p for p in range(1, min(inner, 16) + 1) if inner % p == 0]))
            heads = inner // head_dim
            return {"expand": expand, "head_dim": head_dim, "d_state": draw(st.integers(1, 8)),
                    "n_groups": draw(st.sampled_from([g for g in range(1, min(heads, 4) + 1) if heads % g == 0])),
                    "conv_kernel": draw(st.integers(2, 4)), "chunk_size": draw(st.integers(1, 16)),
                    "conv_bias": draw(st.booleans()), "bias": draw(st.booleans())}

        return build()

    # ── HF transformers interop (Mamba2Mixer) ──
    hf_block = "mamba2"

    @classmethod
    def from_hf(cls, cfg) -> dict[str, Any]:
        hidden = cfg.take("d_model", int)
        heads, head_dim = cfg.take("ssm_heads", int), cfg.take("ssm_head_dim", int)
        expand = cfg.take("ssm_expand", int)
        if heads * head_dim != expand * hidden:
            raise cfg.refuse("ssm_heads", f"{heads} heads of {head_dim} differ from expand · hidden_size "
                             f"({expand * hidden}); transformers refuses it too")
        key = cfg.key("ssm_time_step_limit")  # (0, inf) by default: read as is (bounds would refuse the inf)
        cfg.mark(key)
        limit = cfg.data.get(key, [0.0, float("inf")])

        def number(x):  # transformers writes inf as {"__float__": "Infinity"} in config.json
            if isinstance(x, dict) and x == {"__float__": "Infinity"}:
                return float("inf")
            return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x

        if not isinstance(limit, (list, tuple)) or [number(x) for x in limit] != [0.0, float("inf")]:
            raise cfg.refuse("ssm_time_step_limit", f"{limit!r}: archspec's scan does not clamp dt (only (0, inf))")
        act = cfg.take("ssm_act", str, default="silu")
        if act not in ("silu", "swish"):
            raise cfg.refuse("hidden_act", f"{act!r}: archspec's Mamba-2 conv is followed by silu")
        return {"kind": cls.model_fields["kind"].default, "expand": expand, "head_dim": head_dim,
                "d_state": cfg.take("ssm_state", int), "n_groups": cfg.take("ssm_groups", int),
                "conv_kernel": cfg.take("ssm_conv", int), "chunk_size": cfg.take("ssm_chunk", int),
                "conv_bias": cfg.take("ssm_conv_bias", bool), "bias": cfg.take("ssm_bias", bool),
                "norm_eps": cfg.take("ssm_norm_eps", float)}

    def to_hf(self, m: Any, out: dict[str, Any], hf: Any, path: tuple[str, ...] = ()) -> None:
        k = hf.keys
        out[k["ssm_heads"]], out[k["ssm_head_dim"]] = self.n_heads(m), self.head_dim
        out[k["ssm_expand"]], out[k["ssm_state"]], out[k["ssm_groups"]] = self.expand, self.d_state, self.n_groups
        out[k["ssm_conv"]], out[k["ssm_chunk"]] = self.conv_kernel, self.chunk_size
        out[k["ssm_conv_bias"]], out[k["ssm_bias"]] = self.conv_bias, self.bias
        out[k["ssm_norm_eps"]] = self.norm_eps

    def hf_weights(self, m: Any, hf: Any) -> list[HFWeight]:
        conv = [HFWeight("conv1d.weight", ("conv1d.weight",))]
        if self.conv_bias:
            conv.append(HFWeight("conv1d.bias", ("conv1d.bias",)))
        return [*linear("in_proj", "in_proj", self.bias, False), *conv,
                *(HFWeight(n, (n,)) for n in ("dt_bias", "A_log", "D", "norm.weight")),
                *linear("out_proj", "out_proj", self.bias, False)]
