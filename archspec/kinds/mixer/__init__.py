"""Token mixers that are not attention: each kind is one unit here, its spec class and its template beside it.
`short_conv` (LFM2's gated short causal convolution, short_conv.py). Attention kinds are mixers too
(archspec.kinds.attention): they hold a positional encoding and a sparsity pattern, which these do not. What the
accounting, the memory plan and codegen ask of every mixer is `archspec.kinds.base.MixerKind`."""

from __future__ import annotations

from archspec.kinds.mixer import short_conv as _short_conv  # noqa: F401 (registers the kind)
from archspec.kinds.mixer.short_conv import ShortConvSpec  # noqa: F401
from archspec.kinds.mixer import mamba2 as _mamba2  # noqa: F401 (registers the kind)
from archspec.kinds.mixer.mamba2 import Mamba2Spec  # noqa: F401
from archspec.kinds.mixer import gated_deltanet as _gated_deltanet  # noqa: F401,E402 (registers the kind)
from archspec.kinds.mixer.gated_deltanet import GatedDeltaNetSpec  # noqa: F401,E402
