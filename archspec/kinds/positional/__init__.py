"""Positional encodings: each module here is one kind (spec class + template beside it)."""

from archspec.kinds.positional import learned, none, rope, sinusoidal  # noqa: F401 (registers the kinds)
from archspec.kinds.positional import alibi  # noqa: F401,I001 (registered last: the union's order is registration's)
