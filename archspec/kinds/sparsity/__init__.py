"""Attention patterns (which keys each query sees): each module here is one kind. The sparse ones call
archspec.runtime.sparse (the blockwise path and the FlexAttention dispatch), which generated files import."""

from archspec.kinds.sparsity import block_sparse, dense, global_local, sliding_window  # noqa: F401 (registers the kinds)
