"""Activations the dense FFN kinds share: one record per activation (the spec's word, the call the generated code
makes, its names, its HF names, where it is allowed); every table the kinds read is derived from `ACTIVATIONS`, so
adding an activation is one entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from archspec.errors import printable


@dataclass(frozen=True)
class Activation:
    name: str  # the spec's word
    expr: str  # the source the generated code computes, `{}` standing for the argument
    glu_name: str  # the gated FFN's name with this activation (`SwiGLU`)
    mlp_name: str | None  # the plain MLP's name for it; None: not allowed in an MLP (`mlp.activation`)
    hf_names: tuple[str, ...] = ()  # transformers' names (ACT2FN) that mean it: the first is the one written out
    keeps_output: bool = False  # whether its backward needs only its output (which the next op keeps anyway)

    def call(self, arg: str) -> str:
        return self.expr.format(arg)


# gelu_tanh: GELU with the tanh approximation (GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`). gelu_new is the tanh
# approximation written out; it agrees with F.gelu(approximate="tanh") to float rounding, as do gelu_python_tanh,
# gelu_accurate (the same formula) and gelu_fast (its constant sqrt(2/pi) written to 10 digits); gelu_python is the
# exact erf form. These are every ACT2FN name whose function equals one of ours (transformers.activations.ACT2CLS);
# HF names not here (quick_gelu, gelu_10, relu2, ...) compute something else and are refused. A model type whose
# config rewrites a name (Gemma's `gelu` is read as gelu_pytorch_tanh) says so in its HFType's `rewrite`.
ACTIVATIONS: tuple[Activation, ...] = (
    Activation("relu", "F.relu({})", "ReGLU", "ReLU", ("relu",), keeps_output=True),
    Activation("gelu", "F.gelu({})", "GEGLU", "GELU", ("gelu", "gelu_python")),
    Activation("gelu_tanh", "F.gelu({}, approximate=\"tanh\")", "GEGLU (tanh GELU)", "GELU (tanh)",
               ("gelu_pytorch_tanh", "gelu_new", "gelu_python_tanh", "gelu_accurate", "gelu_fast")),
    Activation("silu", "F.silu({})", "SwiGLU", "SiLU", ("silu", "swish")),
    Activation("sigmoid", "torch.sigmoid({})", "GLU", None, ("sigmoid",), keeps_output=True),
)
BY_NAME: dict[str, Activation] = {a.name: a for a in ACTIVATIONS}
assert len(BY_NAME) == len(ACTIVATIONS), "two activations share a name"

# The spec's types (pydantic reads them for validation and the JSON Schema; the strategies draw from them).
ActivationName = Literal[tuple(a.name for a in ACTIVATIONS)]  # type: ignore[valid-type]
MLPActivation = Literal[tuple(a.name for a in ACTIVATIONS if a.mlp_name is not None)]  # type: ignore[valid-type]

# The tables the kinds read, derived from the records.
CALLS = {a.name: a.expr for a in ACTIVATIONS}
GLU_NAMES = {a.name: a.glu_name for a in ACTIVATIONS}
MLP_NAMES = {a.name: a.mlp_name for a in ACTIVATIONS if a.mlp_name is not None}
KEEPS_OUTPUT = frozenset(a.name for a in ACTIVATIONS if a.keeps_output)
TO_HF = {a.name: a.hf_names[0] for a in ACTIVATIONS if a.hf_names}  # ours → transformers' (what export writes)
FROM_HF = dict(sorted((hf, a.name) for a in ACTIVATIONS for hf in a.hf_names))  # transformers' → ours
assert len(FROM_HF) == sum(len(a.hf_names) for a in ACTIVATIONS), "an HF name means two activations"


def call(activation: str, arg: str) -> str:
    """The source of `activation(arg)`; only the known words above can reach it."""
    return BY_NAME[activation].call(arg)


def from_hf(cfg, allowed: tuple[str, ...]) -> str:
    """Our activation word for the config's `activation` key, or refused by name."""
    name = cfg.take("activation", str)
    ours = FROM_HF.get(name)
    if ours not in allowed:
        known = ", ".join(k for k, v in FROM_HF.items() if v in allowed)
        raise cfg.refuse("activation", f"{printable(repr(name), 60)} has no archspec equivalent here (mapped: {known})")
    return ours
