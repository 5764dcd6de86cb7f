"""The attention family: how a layer's queries read earlier positions. Each kind is one unit here, its spec class
and its template beside it: `gqa` (the default: multi-head, grouped-query and multi-query attention, gqa.py) and
`mla` (DeepSeek-V2/V3's multi-head latent attention, mla.py). Every kind holds the `positional` and `sparsity`
families; what the accounting, memory plan and codegen ask of every kind is `archspec.kinds.base.AttentionKind`."""

from __future__ import annotations

from typing import Any

from archspec.kinds.attention import gqa as _gqa  # noqa: F401 (registers the default kind)
from archspec.kinds.attention import mla as _mla  # noqa: F401
from archspec.kinds.attention.gqa import AttentionSpec, QKNorm  # noqa: F401
from archspec.kinds.attention.mla import MLASpec  # noqa: F401
from archspec.kinds.base import family

Attention = family("attention").union()


def past_context_refusal(m: Any) -> str | None:
    """Why model `m` cannot run past its context_length, or None when it can: when every layer looks back at most a
    window (`SparsityKind.max_lookback`) and positions reach attention only as offsets (`PositionalKind.relative`),
    each layer's cache rolls and no query meets an offset it did not meet in training."""
    positional = m.attention.positional
    if not type(positional).relative:
        return f"its positions are absolute ({positional.describe(m)})"
    for i, b in enumerate(m.blocks()):
        if b.token_mixer.max_lookback() is None:
            what = b.attention.sparsity.describe(m) if b.token_mixer is b.attention else b.token_mixer.describe(m)
            return f"layer {i} has {what}, not a window"
    return None
