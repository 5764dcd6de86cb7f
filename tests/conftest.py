"""Fixtures shared by several test files. Keep this small: a fixture belongs here only when several files need it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gen_dir(tmp_path_factory):
    """A session-wide directory for generated modules. Hypothesis properties cannot use the function-scoped
    `tmp_path` (one directory would serve every example anyway); generated files are named by spec and imported by
    content hash, so sharing one directory is safe."""
    return tmp_path_factory.mktemp("generated")
