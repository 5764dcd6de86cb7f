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
