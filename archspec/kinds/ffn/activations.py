"""Activations the dense FFN kinds share: the spec's word → the call the generated code makes, and a name."""

from __future__ import annotations

from typing import Literal

# gelu_tanh: GELU with the tanh approximation (GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`).
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "sigmoid"]
MLPActivation = Literal["relu", "gelu", "gelu_tanh", "silu"]

CALLS = {
    "relu": "F.relu({})",
    "gelu": "F.gelu({})",
    "gelu_tanh": "F.gelu({}, approximate=\"tanh\")",
    "silu": "F.silu({})",
    "sigmoid": "torch.sigmoid({})",
}
GLU_NAMES = {"silu": "SwiGLU", "gelu": "GEGLU", "gelu_tanh": "GEGLU (tanh GELU)", "relu": "ReGLU", "sigmoid": "GLU"}
MLP_NAMES = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU (tanh)", "silu": "SiLU"}


# Activations whose backward needs only their output (which the next op keeps anyway); the others keep their input.
KEEPS_OUTPUT = frozenset({"relu", "sigmoid"})


def call(activation: str, arg: str) -> str:
    """The source of `activation(arg)`; only the known words above can reach it."""
    return CALLS[activation].format(arg)


# transformers' activation names (ACT2FN) → ours. gelu_new is the tanh approximation written out; it agrees with
# F.gelu(approximate="tanh") to float rounding. Names not here (gelu_fast, quick_gelu, relu2, ...) are refused.
FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
           "silu": "silu", "swish": "silu", "sigmoid": "sigmoid"}
TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu", "sigmoid": "sigmoid"}


def from_hf(cfg, allowed: tuple[str, ...]) -> str:
    """Our activation word for the config's `activation` key, or refused by name."""
    name = cfg.take("activation", str)
    ours = FROM_HF.get(name)
    if ours not in allowed:
        known = ", ".join(k for k, v in FROM_HF.items() if v in allowed)
        raise cfg.refuse("activation", f"{name!r} has no archspec equivalent here (mapped: {known})")
    return ours
