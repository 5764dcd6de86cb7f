"""Corpora: each module here is one corpus kind (spec class, how its text or examples are made, what names them)."""

# Registration order is the order of the spec's union (its error message and JSON Schema): keep it.
from archspec.data.corpus import stdlib  # noqa: F401 · each import registers its kind
from archspec.data.corpus import files  # noqa: F401
from archspec.data.corpus import mqar  # noqa: F401
from archspec.data.corpus import passkey  # noqa: F401
from archspec.data.corpus import media  # noqa: F401
from archspec.data.corpus import media_recall  # noqa: F401
