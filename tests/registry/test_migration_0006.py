"""Migration 0006 (runs.scheduler_job), the scheduler-job and launcher-KILLED writes, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect

from archspec.registry import Registry
from archspec.registry.migrate import alembic_config, head_revision
from .helpers import make_info, record_run


def test_migration_0006_up_and_down_keeps_the_runs(registry_url):
    reg = Registry(registry_url)
    info = make_info()
    record_run(reg, info, {"val_loss": [(0, 2.0)]})
    reg.set_scheduler_job(info.run_id, "1234_7")
    assert reg.get_run(info.run_id).scheduler_job == "1234_7"
    with reg.engine.connect().execution_options(archspec_write=True) as conn, conn.begin():
        command.downgrade(alembic_config(conn), "0005")
    assert "scheduler_job" not in {c["name"] for c in inspect(reg.engine).get_columns("runs")}
    reg.close()
    with Registry(registry_url) as old:
        assert old.upgrade() == ("0005", head_revision())
        run = old.get_run(info.run_id)
        assert run.scheduler_job is None and run.metrics == {"val_loss": 2.0}


def test_a_run_whose_job_died_is_killed_at_once_and_an_ended_one_is_left(registry):
    running, done = make_info(seed=0), make_info(seed=1)
    registry.start_run(running, heartbeat_timeout_s=3600)  # a fresh heartbeat: the reaper would wait an hour
    record_run(registry, done, {"val_loss": [(0, 2.0)]})
    assert registry.mark_killed(running.run_id, "its job 1234 (slurm) died: node failure")
    assert not registry.mark_killed(done.run_id, "too late")
    assert registry.get_run(running.run_id).status == "KILLED"
    assert "node failure" in registry.get_run(running.run_id).error
    assert registry.get_run(done.run_id).status == "FINISHED"
