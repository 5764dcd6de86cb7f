"""Attention patterns (which keys each query sees): each module here is one kind. The sparse ones share
sparse_attention.py.j2 (the blockwise path and the FlexAttention dispatch), rendered once per generated file."""

from archspec.kinds.sparsity import block_sparse, dense, global_local, sliding_window  # noqa: F401 (registers the kinds)
