"""Positional encodings: each module here is one kind (spec class + template beside it)."""

from archspec.kinds.positional import learned, none, rope, sinusoidal  # noqa: F401 (registers the kinds)
