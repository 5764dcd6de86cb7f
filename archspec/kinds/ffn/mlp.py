"""MLP: down(act(up(x))), as in GPT-2 (GELU at 4·d_model)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from archspec.kinds.base import Const, Divides, FFNKind, Split, TPPlan, lit_bool, lit_int, register
from archspec.kinds.ffn import activations
from archspec.kinds.ffn.activations import KEEPS_OUTPUT, MLP_NAMES, MLPActivation, call
from archspec.kinds.hf import HFUnsupported, linear, put_fact
from archspec.kinds.limits import MAX_HIDDEN


@register
class MLPSpec(FFNKind):
    kind: Literal["mlp"] = "mlp"  # up → activation → down
    prefix = "MLP"
    activation: MLPActivation = "gelu"
    hidden_dim: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="default 4 · d_model")
    bias: bool = True

    def tensor_parallel(self, m):
        """up split by hidden units (colwise), down by its input (rowwise, reduce-scattered over the sequence)."""
        return TPPlan({"": Split("gather"), "up_proj": Split("colwise"), "down_proj": Split("rowwise")},
                      divides=(Divides(("hidden_dim",), self.hidden_dim, "hidden_dim"),))

    def fill_defaults(self, m) -> None:
        if self.hidden_dim is None:
            object.__setattr__(self, "hidden_dim", min(MAX_HIDDEN, 4 * m.d_model))

    def params(self, d_model: int) -> int:
        return 2 * d_model * self.hidden_dim + ((self.hidden_dim + d_model) if self.bias else 0)

    def flops(self, d_model: int) -> int:
        return 2 * 2 * d_model * self.hidden_dim

    def saved_elements(self, d_model: int) -> int:
        return (1 if self.activation in KEEPS_OUTPUT else 2) * self.hidden_dim  # up's output, act's output

    def constants(self, m) -> list[Const]:
        return [Const("FFN_HIDDEN", lit_int(self.hidden_dim), f"{self.hidden_dim / m.d_model:.3g} × D_MODEL"),
                Const("FFN_BIAS", lit_bool(self.bias))]

    def describe(self, m) -> str:
        return f"{MLP_NAMES[self.activation]} MLP FFN (hidden {self.hidden_dim})"

    def template_context(self, m):
        return {"act_up": call(self.activation, "self.up_proj(x)"), "activation_name": self.activation}

    hf_block = "plain_mlp"

    @classmethod
    def from_hf(cls, cfg):
        hidden = cfg.take("ffn_hidden", int, default=None)
        if hidden is None:  # GPT-2's n_inner: null means 4 · n_embd
            hidden = 4 * cfg.take("d_model", int)
        return {"kind": "mlp", "hidden_dim": hidden, "bias": cfg.fact("mlp_bias"),
                "activation": activations.from_hf(cfg, get_args(MLPActivation))}

    def to_hf(self, m, out, hf, path):
        # A type without the key fixes the value (BLOOM: 4 · hidden_size, tanh GELU): the spec must have it.
        if "ffn_hidden" in hf.keys:
            out[hf.keys["ffn_hidden"]] = self.hidden_dim
        elif self.hidden_dim != 4 * m.d_model:
            raise HFUnsupported(f"{'.'.join((*path, 'hidden_dim'))}: {self.hidden_dim} cannot be expressed as "
                                f"{hf.model_type} (its MLP is always 4 · d_model = {4 * m.d_model} wide)")
        if "activation" in hf.keys:
            out[hf.keys["activation"]] = activations.TO_HF[self.activation]
        elif activations.FROM_HF.get(hf.defaults.get("activation")) != self.activation:
            raise HFUnsupported(f"{'.'.join((*path, 'activation'))}: {self.activation} cannot be expressed as "
                                f"{hf.model_type} (its MLP's activation is always "
                                f"{activations.FROM_HF.get(hf.defaults.get('activation'))})")
        put_fact(out, hf, "mlp_bias", self.bias, (*path, "bias"))

    def hf_weights(self, m, hf):
        # GPT-2: c_fc / c_proj, Conv1D
        return [w for proj in ("up", "down")
                for w in linear(f"{proj}_proj", hf.names.get(proj, f"{proj}_proj"), self.bias, hf.conv1d)]

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        return {"hidden_dim": st.integers(1, ctx["max_hidden"])}
