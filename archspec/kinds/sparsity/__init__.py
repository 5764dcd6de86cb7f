"""Attention patterns (which keys each query sees): each module here is one kind."""

from archspec.kinds.sparsity import dense  # noqa: F401 (registers the kinds)
