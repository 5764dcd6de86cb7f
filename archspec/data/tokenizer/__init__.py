"""Tokenizers: each module here is one tokenizer kind (spec class, the tokenizer it builds, how it travels)."""

# Registration order is the order of the spec's union (its error message and JSON Schema): keep it.
from archspec.data.tokenizer import byte  # noqa: F401 · each import registers its kind
from archspec.data.tokenizer import bpe  # noqa: F401
