"""A registry whose rows or tables were changed by something other than archspec (issue 12): every read reports the
damaged row and carries on with the rest; a schema that is not ours is refused for reads and writes alike, with a
message naming what is missing. SQLite only: the damage is done with raw SQL that SQLite's loose typing allows."""

from __future__ import annotations

import logging
import math
import sqlite3

import pytest

from archspec.cli import main
from archspec.errors import UserError
from archspec.registry import Registry

from .helpers import make_info, record_run


@pytest.fixture
def damaged(tmp_path):
    """(url, db path, run id, spec hash, apply(sql)) of a registry holding one finished run with metrics."""
    db = tmp_path / "registry.db"
    url = f"sqlite:///{db}"
    info = make_info()
    with Registry(url) as reg:
        record_run(reg, info, metrics={"val_loss": [(1, 3.0), (2, 2.5)]}, summary={"val_loss": 2.5})

    def apply(sql: str) -> None:
        with sqlite3.connect(db) as conn:
            conn.executescript(sql)

    return url, info.run_id, info.model_hash, apply


def _cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


DAMAGE = {
    "spec-json": ("UPDATE specs SET canonical_json = '{bad'", "canonical_json: not valid JSON"),
    "accounting-json": ("UPDATE specs SET accounting_json = '[1'", "accounting_json: not valid JSON"),
    "recipe-json": ("UPDATE runs SET recipe_json = '{bad'", "recipe_json: not valid JSON"),
    "time": ("UPDATE runs SET created = 'yesterday', heartbeat = 'x'", "'yesterday' is not an ISO date/time"),
    "metric-text": ("UPDATE metrics SET value = 'abc'", "'abc' is not a number"),
    "stats-text": ("UPDATE metric_stats SET last_value = 'abc', min_value = 'x'", "'abc' is not a number"),
    "summary-text": ("UPDATE summary_metrics SET value = 'abc'", "'abc' is not a number"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_reads_report_a_damaged_row_and_carry_on(case, damaged, caplog, capsys):
    url, run_id, model_hash, apply = damaged
    sql, needle = DAMAGE[case]
    apply(sql)
    with caplog.at_level(logging.WARNING, logger="archspec.registry"):
        with Registry(url) as reg:
            (run,) = reg.runs()
            assert run.id == run_id
            run.to_dict(), run.flat()  # every field of the row, as `runs show/export` use them
            history = reg.metric_history(run_id, "val_loss")
            (spec,) = reg.specs()
            spec.to_dict()
        for argv in (["runs", "list"], ["runs", "show", run_id], ["runs", "export"], ["runs", "export", "--format",
                                                                                        "csv"], ["specs", "list"]):
            rc, out, err = _cli(capsys, *argv, "--registry", url)
            assert rc == 0 and "Traceback" not in out + err, (argv, err)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(needle in w and w.startswith("warning: registry row damaged: ") for w in warnings), warnings
    if case == "metric-text":
        assert [p.step for p in history] == [1, 2] and all(math.isnan(p.value) for p in history)
    if case == "summary-text":
        assert math.isnan(run.summary["val_loss"])


def test_a_run_can_be_trained_again_over_a_damaged_time(damaged):
    url, run_id, _, apply = damaged
    apply("UPDATE runs SET heartbeat = 'not a time', status = 'RUNNING'")
    with Registry(url) as reg:
        attempt = reg.start_run(make_info(), heartbeat_timeout_s=60)  # a heartbeat that cannot be read is stale
        assert attempt == 2 and reg.run_status(run_id) == "RUNNING"


@pytest.mark.parametrize("sql,needle", [
    ("DROP TABLE metric_stats", "table metric_stats is missing"),
    ("DROP TABLE run_tags", "table run_tags is missing"),
    ("ALTER TABLE artifacts RENAME COLUMN path TO where_it_is", "table artifacts lacks column path"),
], ids=["stats", "tags", "column"])
def test_a_schema_that_is_not_ours_is_refused_for_reads_and_writes(sql, needle, damaged, capsys):
    url, run_id, _, apply = damaged
    apply(sql)
    for argv in (["runs", "list"], ["specs", "list"], ["runs", "show", run_id]):
        rc, out, err = _cli(capsys, *argv, "--registry", url)
        assert rc == 2 and "Traceback" not in out + err and needle in err, err
        assert "archspec will not write into it" in err
    with pytest.raises(UserError, match=needle):
        Registry(url).start_run(make_info(seed=7), heartbeat_timeout_s=60)
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:  # and nothing was written
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_stored_text_with_control_characters_or_markup_is_shown_inert(tmp_path, capsys):
    """Tags, sweep names, errors and artifact paths come from files and users: shown, they cannot forge lines, clear
    the screen or style the output (rich markup)."""
    url = f"sqlite:///{tmp_path}/registry.db"
    hostile = "x\x1b[2J\rOK: forged [bold red]markup[/]\x07"
    info = make_info(tags={"corpus": hostile}, sweep="s\x1b[31m")
    with Registry(url) as reg:
        record_run(reg, info, metrics={"val_loss": [(1, 3.0)]})
        reg.add_artifact(info.run_id, "checkpoint", "/runs/a\rOK\x1b[2K.pt")
        reg.finish_run(info.run_id, 1, "FAILED", f"ValueError: {hostile}\n\nTraceback ...")
    for argv in (["runs", "show", info.run_id], ["runs", "list", "--where", "tags.corpus LIKE 'x%'"],
                 ["runs", "compare", info.run_id, info.run_id]):
        rc, out, err = _cli(capsys, *argv, "--registry", url)
        assert rc == 0, err
        assert all(c.isprintable() or c == "\n" for c in out), repr(out)
    rc, out, _ = _cli(capsys, "runs", "show", info.run_id, "--registry", url)
    assert "[bold red]markup[/]" in out and "\\x1b[2J\\rOK" in out  # shown literally, escaped
