"""Gated linear unit FFN (Shazeer, 2020): down(act(gate(x)) * up(x)); silu = SwiGLU (LLaMA), gelu = GEGLU."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from archspec.kinds.base import Const, Divides, FFNKind, Split, TPPlan, lit_bool, lit_int, register
from archspec.kinds.ffn import activations
from archspec.kinds.ffn.activations import GLU_NAMES, KEEPS_OUTPUT, ActivationName, call
from archspec.kinds.hf import HFUnsupported, HFWeight, linear, put_fact
from archspec.kinds.limits import MAX_HIDDEN


@register
class GLUSpec(FFNKind):
    kind: Literal["glu"] = "glu"  # down(act(gate(x)) * up(x)): silu = SwiGLU, gelu = GEGLU, relu = ReGLU, sigmoid = GLU
    prefix = "GLU"
    activation: ActivationName = "silu"
    hidden_dim: int | None = Field(
        None, ge=1, le=MAX_HIDDEN, description="default 8/3 · d_model rounded up to a multiple of 32 (LLaMA)"
    )
    bias: bool = False

    def tensor_parallel(self, m):
        """gate and up split by hidden units (colwise), down by its input (rowwise, reduce-scattered over the
        sequence): each rank computes FFN_HIDDEN // tp hidden units of every position."""
        return TPPlan({"": Split("gather"), "gate_proj": Split("colwise"), "up_proj": Split("colwise"),
                       "down_proj": Split("rowwise")},
                      divides=(Divides(("hidden_dim",), self.hidden_dim, "hidden_dim"),))

    def fill_defaults(self, m) -> None:
        if self.hidden_dim is None:
            # 2/3 of 4·d keeps GLU's three matrices at the parameter count of a 4·d MLP's two (LLaMA); rounded up to
            # a multiple of 32 for matmul-friendly shapes (d_model 512 → 1376).
            object.__setattr__(self, "hidden_dim", min(MAX_HIDDEN, -(-(8 * m.d_model) // (3 * 32)) * 32))

    def params(self, d_model: int) -> int:
        return 3 * d_model * self.hidden_dim + ((2 * self.hidden_dim + d_model) if self.bias else 0)

    def flops(self, d_model: int) -> int:
        return 2 * 3 * d_model * self.hidden_dim

    def saved_elements(self, d_model: int) -> int:
        return (3 if self.activation in KEEPS_OUTPUT else 4) * self.hidden_dim  # gate, act(gate), up, product

    def constants(self, m) -> list[Const]:
        return [Const("FFN_HIDDEN", lit_int(self.hidden_dim), f"{self.hidden_dim / m.d_model:.3g} × D_MODEL"),
                Const("FFN_BIAS", lit_bool(self.bias))]

    def describe(self, m) -> str:
        return f"{GLU_NAMES[self.activation]} FFN (hidden {self.hidden_dim})"

    def template_context(self, m):
        return {"act_gate": call(self.activation, "self.gate_proj(x)"), "activation_name": self.activation,
                "glu_name": GLU_NAMES[self.activation]}

    hf_block = "gated_mlp"

    @classmethod
    def from_hf(cls, cfg):
        hidden = cfg.take("ffn_hidden", int)
        return {"kind": "glu", "hidden_dim": hidden, "bias": cfg.fact("mlp_bias"),
                "activation": activations.from_hf(cfg, get_args(ActivationName))}

    def to_hf(self, m, out, hf, path):
        out[hf.keys["ffn_hidden"]] = self.hidden_dim
        if "activation" in hf.keys:
            out[hf.keys["activation"]] = activations.TO_HF[self.activation]
        elif activations.FROM_HF.get(hf.defaults.get("activation")) != self.activation:  # fixed by the type (LFM2)
            raise HFUnsupported(f"{'.'.join((*path, 'activation'))}: {self.activation} cannot be expressed as "
                                f"{hf.model_type} (its gated MLP's activation is always "
                                f"{activations.FROM_HF.get(hf.defaults.get('activation'))})")
        put_fact(out, hf, "mlp_bias", self.bias, (*path, "bias"))

    def hf_weights(self, m, hf):
        # LLaMA and its copies: gate_proj / up_proj / down_proj; GLM and Phi-3 fuse gate and up into one
        # gate_up_proj, gate rows first (their forward chunks it in two: gate, up)
        if "gate_up" in hf.names:
            fused = [HFWeight(("gate_proj.weight", "up_proj.weight"), (f"{hf.names['gate_up']}.weight",),
                              (self.hidden_dim, self.hidden_dim))]
            if self.bias:
                fused.append(HFWeight(("gate_proj.bias", "up_proj.bias"), (f"{hf.names['gate_up']}.bias",),
                                      (self.hidden_dim, self.hidden_dim)))
            return fused + linear("down_proj", hf.names.get("down", "down_proj"), self.bias, hf.conv1d)
        return [w for proj in ("gate", "up", "down")
                for w in linear(f"{proj}_proj", hf.names.get(proj, f"{proj}_proj"), self.bias, hf.conv1d)]

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        return {"hidden_dim": st.integers(1, ctx["max_hidden"])}
