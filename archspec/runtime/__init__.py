"""The machinery generated model files import: KV caches and the decode loop, sparse attention's kernels (the
blockwise autograd Function, FlexAttention dispatch, their caches) and the MoE grouped GEMM. A model file holds the
architecture and calls these by name (`sparse_attention(q, k, v, WINDOW_PATTERN)`, `grouped_mm(x, w, offs)`).

This package needs only torch and the standard library and imports nothing else of archspec, so a model can be
copied out with it: the model file plus `archspec/__init__.py` and `archspec/runtime/` (or `pip install archspec`).
"""

from __future__ import annotations

from archspec.runtime.cache import KVCache, LatentCache, causal_mask
from archspec.runtime.conv import ConvCache, causal_conv1d
from archspec.runtime.decode import DECODE_MODES, DecodeStep
from archspec.runtime.generation import next_token_probs, sample_next, stream
from archspec.runtime.grouped_gemm import grouped_mm, grouped_mm_usable
from archspec.runtime.linear_attention import DeltaRuleCache, gated_delta_rule, l2_normalize
from archspec.runtime.media import MediaCache, media_attention, media_items
from archspec.runtime.scores import score_mod_attention
from archspec.runtime.sparse import RollingKVCache, RollingLatentCache, SparsePattern, sparse_attention
from archspec.runtime.ssd import GatedRMSNorm, SSMCache, ssd

__all__ = ["KVCache", "LatentCache", "causal_mask", "ConvCache", "causal_conv1d", "next_token_probs", "sample_next", "stream", "DecodeStep",
           "DECODE_MODES", "grouped_mm", "grouped_mm_usable",
           "RollingKVCache", "RollingLatentCache", "SparsePattern", "sparse_attention", "score_mod_attention",
           "SSMCache", "GatedRMSNorm", "ssd",
           "DeltaRuleCache", "gated_delta_rule", "l2_normalize",
           "MediaCache", "media_attention", "media_items"]
