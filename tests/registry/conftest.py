"""Registry test fixtures: every `registry_url` test runs on SQLite, and on PostgreSQL as well when
ARCHSPEC_TEST_PG_URL names a server (`.ci/run` starts one with scripts/ci-postgres.sh).

Each PostgreSQL test gets its own schema (through `search_path` in the URL), dropped afterwards, so tests never see
each other's rows and no database has to be created per test.
"""

from __future__ import annotations

import os
import uuid

import pytest

PG_URL = os.environ.get("ARCHSPEC_TEST_PG_URL")

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=[
        pytest.mark.postgres,
        pytest.mark.skipif(not PG_URL, reason="ARCHSPEC_TEST_PG_URL not set (scripts/ci-postgres.sh starts a server)"),
    ]),
]


def _pg_schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"  # type: ignore[operator]
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def registry_url(backend, tmp_path):
    """A fresh, empty registry database URL on the backend under test."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry' / 'archspec.db'}"
        return
    from sqlalchemy import create_engine, text

    schema = "t_" + uuid.uuid4().hex[:12]
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield _pg_schema_url(schema)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def registry(registry_url):
    from archspec.registry import Registry

    reg = Registry(registry_url)
    reg.upgrade()  # created, as a first write would (opening alone creates nothing)
    yield reg
    reg.close()
