"""The sweep tests' fixtures (a small real-text corpus, a session cache, a tiny base spec): one definition, in
tests/ablate/conftest.py."""

from tests.ablate.conftest import base_spec, corpus, session_cache, workdir  # noqa: F401 (pytest fixtures)
