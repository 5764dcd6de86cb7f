"""Reads never write: no read path reaps, migrates or creates. `archspec runs reap` and `archspec registry upgrade`
are the explicit writes; reads show staleness, read a compatible older schema as it is, and refuse the rest naming
`archspec registry upgrade`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from alembic import command
from sqlalchemy import text

from archspec.cli import main
from archspec.registry import Registry
from archspec.registry import migrate
from archspec.registry.migrate import VERSION_TABLE, alembic_config, head_revision

from .helpers import make_info, record_run


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _file_digest(path: Path) -> str:
    """The database and its WAL: what a write would change (the -shm index is shared memory, not data)."""
    parts = [path, path.with_name(path.name + "-wal")]
    return hashlib.sha256(b"".join(p.read_bytes() for p in parts if p.exists())).hexdigest()


def _stale_running_run(reg) -> str:
    info = make_info()
    record_run(reg, info, {"loss": [(0, 1.0)]}, status="RUNNING", heartbeat_timeout_s=0.001)
    return info.run_id


def test_every_read_command_leaves_the_database_unchanged(tmp_path, capsys):
    db = tmp_path / "reg.db"
    url = f"sqlite:///{db}"
    reg = Registry(url)
    run_id = _stale_running_run(reg)
    reg.close()
    before = _file_digest(db)
    reads = [["runs", "list"], ["runs", "list", "--format", "json"], ["runs", "show", run_id],
             ["runs", "export"], ["specs", "list"], ["registry", "status"]]
    for args in reads:
        code, out, err = run_cli(capsys, *args[:1], "--registry", url, *args[1:]) if args[0] != "registry" else \
            run_cli(capsys, *args, "--registry", url)
        assert code == 0, (args, err)
        if args == ["runs", "list"]:
            assert "RUNNING (stale)" in out and "archspec runs reap" in out
        if args == ["runs", "list", "--format", "json"]:
            (row,) = json.loads(out)
            assert row["status"] == "RUNNING" and row["stale"] is True
    assert _file_digest(db) == before
    code, out, err = run_cli(capsys, "runs", "--registry", url, "reap")
    assert code == 0 and out.split() == [run_id] and "marked 1 stale run KILLED" in err
    with Registry(url) as again:
        assert again.get_run(run_id).status == "KILLED"


def test_reading_a_missing_registry_creates_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'nowhere' / 'reg.db'}"
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", url)
    assert code == 0 and "no runs" in out
    code, out, _ = run_cli(capsys, "registry", "status", "--registry", url)
    assert code == 0 and "no registry there yet" in out
    assert not (tmp_path / "nowhere").exists()
    code, out, _ = run_cli(capsys, "registry", "upgrade", "--registry", url)
    assert code == 0 and f"created at revision {head_revision()}" in out
    code, out, _ = run_cli(capsys, "registry", "upgrade", "--registry", url)
    assert code == 0 and "already at revision" in out


def test_readable_revisions_follow_shape_changes():
    """0002 only added indexes (0001 read as it was, then); 0003 changed the tables and 0004 added the evaluation
    tables, so only head reads now."""
    assert migrate.readable_revisions() == {head_revision()} == {"0007"}


def test_an_incompatible_older_schema_is_refused_naming_the_upgrade_command(registry_url, capsys):
    reg = Registry(registry_url)
    info = make_info()
    record_run(reg, info, {"loss": [(0, 1.0)]})
    with reg.engine.connect().execution_options(archspec_write=True) as conn, conn.begin():
        command.downgrade(alembic_config(conn), "0002")
    reg.close()
    code, _, err = run_cli(capsys, "runs", "list", "--registry", registry_url)
    assert code == 2 and "revision 0002" in err and "archspec registry upgrade" in err
    code, out, _ = run_cli(capsys, "registry", "status", "--registry", registry_url)
    assert code == 0 and "older than this archspec reads" in out
    with Registry(registry_url) as left:
        assert left.schema_revision == "0002"  # refused, and left alone
    code, out, err = run_cli(capsys, "registry", "upgrade", "--registry", registry_url)
    assert code == 0 and f"upgraded from revision 0002 to {head_revision()}" in out, err
    code, out, err = run_cli(capsys, "runs", "list", "--registry", registry_url, "--format", "json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [info.run_id]


def test_a_newer_schema_is_refused_by_status_and_upgrade(registry, registry_url, capsys):
    with registry.engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    for args in (["registry", "status"], ["registry", "upgrade"]):
        code, _, err = run_cli(capsys, *args, "--registry", registry_url)
        assert code == 2 and "9999" in err and "newer archspec" in err
