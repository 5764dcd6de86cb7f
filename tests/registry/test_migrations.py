"""Alembic migrations: created from empty, matching the models, refused when newer, migrated once under races."""

from __future__ import annotations

import threading

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from archspec.registry import Registry, SchemaTooNewError, SchemaTooOldError
from archspec.registry.migrate import VERSION_TABLE, alembic_config, current_revision, head_revision
from archspec.registry.models import Base

from .helpers import accounting, create_registry, make_info, make_spec, record_run

TABLES = {"specs", "spec_params", "spec_accounting", "runs", "run_params", "run_tags", "metrics", "metric_stats",
          "summary_metrics", "artifacts"}


def test_opening_and_reading_create_nothing_the_first_write_creates_the_schema(registry_url, backend, tmp_path):
    reg = Registry(registry_url)
    assert reg.runs() == [] and reg.specs() == [] and reg.schema_revision is None
    if backend == "sqlite":
        assert not (tmp_path / "registry").exists()  # not even the directory
    else:
        assert not TABLES & set(inspect(reg.engine).get_table_names())  # reads created nothing
    record_run(reg, make_info(), {"loss": [(0, 1.0)]})
    names = set(inspect(reg.engine).get_table_names())
    assert TABLES | {VERSION_TABLE} <= names
    with reg.engine.connect() as conn:
        assert current_revision(conn) == head_revision() == reg.schema_revision
    reg.close()
    # Reopening an up-to-date database changes nothing and keeps the rows.
    with Registry(registry_url) as again:
        assert len(again.runs()) == 1


def test_head_matches_the_models(registry):
    """A model change without its migration (or the reverse) fails here."""
    with registry.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        diffs = compare_metadata(ctx, Base.metadata)
    assert diffs == []


def test_downgrade_and_upgrade_again(registry, registry_url):
    with registry.engine.connect().execution_options(archspec_write=True) as conn, conn.begin():
        command.downgrade(alembic_config(conn), "base")
    assert not TABLES & set(inspect(registry.engine).get_table_names())
    registry.close()
    with Registry(registry_url) as reg:
        assert reg.upgrade() == (None, head_revision())
        assert TABLES <= set(inspect(reg.engine).get_table_names())


def test_a_newer_schema_is_refused_and_left_alone(registry_url):
    create_registry(registry_url)
    engine = create_engine(registry_url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0042_from_the_future'"))
    with pytest.raises(SchemaTooNewError) as e:
        Registry(registry_url)
    message = str(e.value)
    assert "0042_from_the_future" in message and head_revision() in message and "newer archspec" in message
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == "0042_from_the_future"
    engine.dispose()


def test_concurrent_first_writers_migrate_once(registry_url):
    """Several workers writing to a fresh database at the same moment: one migrates, the others wait and find head."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_it() -> None:
        try:
            barrier.wait()
            create_registry(registry_url)  # what a first write does
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    engine = create_engine(registry_url)
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {VERSION_TABLE}")).scalar() == 1
    engine.dispose()


def test_an_older_schema_is_refused_by_reads_and_upgraded_by_a_write(registry_url):
    """A database left at the first revision (by an older archspec): reads refuse it (its shape is not today's) and
    change nothing; the first write brings it to head, rows intact."""
    reg = Registry(registry_url)
    info = make_info()
    record_run(reg, info, {"loss": [(0, 2.0), (1, 1.0)]})
    with reg.engine.connect().execution_options(archspec_write=True) as conn, conn.begin():
        command.downgrade(alembic_config(conn), "0001")
    reg.close()
    with Registry(registry_url) as again:
        with pytest.raises(SchemaTooOldError, match="archspec registry upgrade"):
            again.runs()
        assert again.schema_revision == "0001"  # the read left it alone
        again.record_spec(make_spec("other"), None, accounting(make_spec("other")))  # a write
        assert again.schema_revision == head_revision() != "0001"
        indexes = {i["name"] for i in inspect(again.engine).get_indexes("metric_stats")}
        assert "ix_metric_stats_key_last_value" in indexes
        assert [r.id for r in again.runs(where="metrics.loss < 1.5")] == [info.run_id]
        assert again.count_metrics(info.run_id) == 2
