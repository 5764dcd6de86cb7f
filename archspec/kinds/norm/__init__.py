"""Norms: each module here is one kind (spec class + template beside it)."""

from archspec.kinds.norm import layernorm, rmsnorm  # noqa: F401 (registers the kinds)
