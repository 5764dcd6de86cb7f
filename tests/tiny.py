"""The tiny model tests build: small enough to generate, import and run in milliseconds on a CPU.

    from tests.tiny import tiny_model, tiny_spec

    tiny_spec()                                     # TINY_MODEL, validated (a Spec named "tiny")
    tiny_spec("k", ffn={"kind": "mlp"})             # with an FFN
    tiny_spec(attention={"positional": {...}})      # a mapping merges into its section: n_heads stays
    tiny_model(base=TINY_GQA, vocab_size=97)        # the `model:` dict, from another base

A test that asserts on a size passes it (`vocab_size=61`) rather than relying on the default here.
"""

from __future__ import annotations

import copy
from typing import Any

from archspec.spec import load_spec_dict
from archspec.spec.model import Spec

TINY_MODEL: dict[str, Any] = {"vocab_size": 64, "context_length": 16, "d_model": 32, "n_layers": 1,
                              "attention": {"n_heads": 2}}
# Two layers with grouped K/V heads, for tests of the generated code's layout (tests/test_codegen.py and
# tests/test_kinds.py shape their tensors by these numbers: change them there too).
TINY_GQA: dict[str, Any] = {"vocab_size": 61, "context_length": 16, "d_model": 32, "n_layers": 2,
                            "attention": {"n_heads": 4, "n_kv_heads": 2}}


def tiny_model(base: dict[str, Any] = TINY_MODEL, **changes: Any) -> dict[str, Any]:
    """A `model:` dict: `base` (a copy) with `changes`; a mapping merges into the section of that name
    (`attention={"bias": True}` keeps n_heads), any other value replaces the field."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def tiny_spec(name: str = "tiny", base: dict[str, Any] = TINY_MODEL, **changes: Any) -> Spec:
    """`tiny_model(base, **changes)` as a validated spec called `name`."""
    return load_spec_dict({"name": name, "model": tiny_model(base, **changes)})
