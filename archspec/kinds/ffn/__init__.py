"""Feed-forward layers: each module here is one kind (spec class + template beside it)."""

from archspec.kinds.ffn import glu, mlp, moe, none  # noqa: F401 (registers the kinds)
