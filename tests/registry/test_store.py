"""Registry store: specs, runs, restarts, liveness, values, URLs."""

from __future__ import annotations

import math
import os
from datetime import timedelta

import pytest

from archspec.errors import UserError
from archspec.registry import Registry, RunActiveError, RunFinishedError, default_url
from archspec.registry.store import accounting_fields, run_params, typed_value
from archspec.spec import model_json, model_hash
from archspec.train.logger import FAILED, FINISHED, KILLED, RUNNING, SCHEDULED

from .helpers import accounting, make_info, make_spec, record_run


def test_default_url(monkeypatch, tmp_path):
    monkeypatch.delenv("ARCHSPEC_REGISTRY", raising=False)
    monkeypatch.setenv("ARCHSPEC_HOME", str(tmp_path / "home"))
    assert default_url() == f"sqlite:///{tmp_path}/home/registry/archspec.db"
    monkeypatch.delenv("ARCHSPEC_HOME")
    (tmp_path / "project" / "specs").mkdir(parents=True)
    (tmp_path / "project" / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "project" / "a" / "b")  # a subdirectory finds its project's registry
    assert default_url() == f"sqlite:///{tmp_path}/project/registry/archspec.db"
    monkeypatch.chdir(tmp_path)  # no project root: the per-user data directory
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_url() == f"sqlite:///{tmp_path}/data/archspec/registry/archspec.db"
    monkeypatch.setenv("ARCHSPEC_REGISTRY", "sqlite:////tmp/x.db")
    assert default_url() == "sqlite:////tmp/x.db"


def test_default_registry_is_created_under_the_project_root_by_the_first_write(tmp_path, monkeypatch):
    monkeypatch.delenv("ARCHSPEC_REGISTRY", raising=False)
    monkeypatch.delenv("ARCHSPEC_HOME", raising=False)
    (tmp_path / "specs").mkdir()
    monkeypatch.chdir(tmp_path)
    with Registry() as reg:
        assert reg.runs() == [] and reg.specs() == [] and reg.run_status("x") is None and reg.count_metrics() == 0
        assert reg.schema_revision is None
        assert not (tmp_path / "registry").exists()  # reads never create
        reg.record_spec(make_spec("tiny"), None, accounting(make_spec("tiny")))
    assert (tmp_path / "registry" / "archspec.db").is_file()


def test_record_spec_is_idempotent_and_keeps_accounting(registry):
    spec = make_spec("tiny")
    acct = accounting(spec)
    for _ in range(2):
        assert registry.record_spec(spec, "a" * 64, acct) == model_hash(spec)
    (row,) = registry.specs()
    assert row.hash == model_hash(spec) and row.name == "tiny" and row.n_runs == 0
    assert row.accounting == {**acct, "seq_len": 64}  # exact integers back, and the seq_len they are at
    assert row.get("flops.seq_len") == 64 == spec.model.context_length
    assert row.get("params.total") == acct["params"]["total"] and isinstance(row.get("params.total"), int)
    assert row.get("kv_cache_bytes") == acct["kv_cache_bytes_per_token"]
    assert row.spec == {"model": __import__("json").loads(model_json(spec))} and row.names == ["tiny"]
    # Re-recording with a new generated hash / accounting (a newer code version) refreshes them.
    acct2 = {**acct, "params": {**acct["params"], "active": 7}}
    registry.record_spec(spec, "b" * 64, acct2)
    (row,) = registry.specs()
    assert row.generated_hash == "b" * 64 and row.get("params.active") == 7
    assert [s.name for s in registry.specs(where="params.active = 7")] == ["tiny"]


def test_values_are_typed():
    assert typed_value(True) == ("bool", None, "true")
    assert typed_value(8) == ("int", 8.0, None)
    assert typed_value(1e-5) == ("float", 1e-5, None)
    assert typed_value("rmsnorm") == ("str", None, "rmsnorm")
    assert typed_value(None) == ("null", None, None)
    assert typed_value(["a", "b"]) == ("json", None, '["a","b"]')
    fields = accounting_fields(accounting(make_spec()))
    assert fields["flops.train"] > 0 and fields["kv_cache_bytes"] > 0 and isinstance(fields["params.total"], int)
    assert run_params({"name": "x", "train": {"steps": 5}}, {"steps": 7})["train.steps"] == 7


def test_run_lifecycle_history_and_summary(registry):
    info = make_info(make_spec("tiny"), seed=3, sweep="sw", tags={"k": "v"})
    attempt = registry.start_run(info, heartbeat_timeout_s=60)
    assert attempt == 1 and registry.run_status(info.run_id) == RUNNING
    pts = [(s, "loss", 10.0 - s, float(s)) for s in range(5)] + [(2, "acc", float("nan"), 0.0)]
    assert registry.write_metrics(info.run_id, 1, pts)
    registry.set_summary(info.run_id, {"final_loss": 6.0})
    registry.add_artifact(info.run_id, "checkpoint", "/ckpt/step4.pt")
    registry.add_artifact(info.run_id, "checkpoint", "/ckpt/step4.pt")  # a resume announces it again: kept once
    assert registry.finish_run(info.run_id, 1, FINISHED)
    run = registry.get_run(info.run_id)
    assert (run.status, run.sweep, run.seed) == (FINISHED, "sw", 3)
    assert (run.tags, run.summary) == ({"k": "v"}, {"final_loss": 6.0})
    assert run.metrics["loss"] == 6.0 and run.best["loss"] == 6.0 and run.max["loss"] == 10.0 and run.steps["loss"] == 4
    assert math.isnan(run.metrics["acc"]) and "acc" not in run.best  # NaN is kept as NaN, and never "best"
    history = registry.metric_history(info.run_id, "loss")
    assert [(p.step, p.value) for p in history] == [(s, 10.0 - s) for s in range(5)]
    assert registry.artifacts(info.run_id) == [("checkpoint", "/ckpt/step4.pt")]
    assert run.params["train.steps"] == info.recipe["steps"] and run.get("params.model.d_model") == 64
    assert run.ended >= run.started and run.duration_s >= 0


def test_recipe_overrides_are_the_run_params(registry):
    info = make_info(make_spec("tiny"), steps=7)
    record_run(registry, info)
    assert [r.id for r in registry.runs(where="params.train.steps = 7")] == [info.run_id]
    assert registry.get_run(info.run_id).get("params.train.steps") == 7


def test_run_id_prefix_and_unknown_ids(registry):
    info = make_info()
    record_run(registry, info)
    assert registry.get_run(info.run_id[:6]).id == info.run_id
    with pytest.raises(UserError, match="no run 'ffffffffff'"):
        registry.get_run("ffffffffff")
    assert registry.run_status("nope") is None


def test_finished_runs_are_refused_unless_rerun(registry):
    info = make_info()
    record_run(registry, info, {"loss": [(0, 1.0)]})
    assert registry.run_status(info.run_id) == FINISHED  # what a sweep checks to skip it
    with pytest.raises(RunFinishedError, match="already FINISHED"):
        registry.start_run(info, heartbeat_timeout_s=60)
    assert registry.start_run(info, heartbeat_timeout_s=60, rerun_finished=True) == 2


def test_live_running_runs_are_refused(registry):
    info = make_info()
    registry.start_run(info, heartbeat_timeout_s=600)
    with pytest.raises(RunActiveError, match="already RUNNING on testhost"):
        registry.start_run(info, heartbeat_timeout_s=600)


@pytest.mark.parametrize("previous", [FAILED, KILLED])
def test_restart_is_a_new_attempt_that_replaces_history_from_its_first_step(registry, previous):
    info = make_info()
    record_run(registry, info, {"loss": [(0, 5.0), (1, 4.0), (2, 3.0)]}, status=previous, summary={"x": 1.0})
    registry.add_artifact(info.run_id, "checkpoint", "step2.pt")
    attempt = registry.start_run(info, heartbeat_timeout_s=60)
    run = registry.get_run(info.run_id)
    assert (attempt, run.attempt, run.status, run.error, run.summary) == (2, 2, RUNNING, None, {})
    # Until the new attempt writes, the old history stays (and so do artifacts: the checkpoint file still exists).
    assert registry.count_metrics(info.run_id) == 3 and registry.artifacts(info.run_id) == [("checkpoint", os.path.abspath("step2.pt"))]
    # A resume from step 2 replaces steps >= 2 and keeps the rest; the stats follow.
    assert registry.write_metrics(info.run_id, 2, [(2, "loss", 2.5, 0.0)], replace_from_step=2)
    assert [(p.step, p.value) for p in registry.metric_history(info.run_id, "loss")] == [(0, 5.0), (1, 4.0), (2, 2.5)]
    run = registry.get_run(info.run_id)
    assert (run.metrics["loss"], run.best["loss"], run.max["loss"]) == (2.5, 2.5, 5.0)
    # The old attempt's writer, if it still lives, can no longer write or end the run.
    assert registry.write_metrics(info.run_id, 1, [(9, "loss", 1.0, 0.0)]) is False
    assert registry.finish_run(info.run_id, 1, FINISHED) is False
    assert registry.count_metrics(info.run_id) == 3 and registry.run_status(info.run_id) == RUNNING


def test_restart_from_scratch_replaces_the_whole_history(registry):
    info = make_info()
    record_run(registry, info, {"loss": [(0, 5.0), (1, 4.0)], "acc": [(1, 0.5)]}, status=KILLED)
    registry.start_run(info, heartbeat_timeout_s=60)
    registry.write_metrics(info.run_id, 2, [(0, "loss", 6.0, 0.0)], replace_from_step=0)
    run = registry.get_run(info.run_id)
    assert registry.count_metrics(info.run_id) == 1 and run.metrics == {"loss": 6.0}


def test_scheduled_runs_start_as_attempt_one(registry):
    info = make_info(sweep="grid")
    assert registry.schedule_run(info) == info.run_id
    assert registry.schedule_run(info) == info.run_id  # idempotent
    assert registry.run_status(info.run_id) == SCHEDULED
    assert [r.id for r in registry.runs(where="status = 'scheduled' and sweep = 'grid'")] == [info.run_id]
    assert registry.start_run(info, heartbeat_timeout_s=60) == 1


def test_stale_runs_are_shown_by_reads_and_marked_killed_by_a_reap(registry, monkeypatch):
    info = make_info()
    registry.start_run(info, heartbeat_timeout_s=30)
    registry.write_metrics(info.run_id, 1, [(0, "loss", 1.0, 0.0)])
    real_now = registry._now()
    monkeypatch.setattr(registry, "_now", lambda: real_now + timedelta(seconds=29))
    assert registry.run_state(info.run_id) == (RUNNING, False)  # within its own timeout
    monkeypatch.setattr(registry, "_now", lambda: real_now + timedelta(seconds=31))
    # Reads show the staleness and write nothing.
    assert registry.run_state(info.run_id) == (RUNNING, True)
    (run,) = registry.runs()
    assert run.status == RUNNING and run.stale and registry.get_run(info.run_id).stale
    assert registry.runs(where="status = 'KILLED'") == []
    assert registry.reap() == [info.run_id]
    (run,) = registry.runs()
    assert run.status == KILLED and "no heartbeat since" in run.error and not run.stale
    assert run.ended is not None and registry.count_metrics(info.run_id) == 1  # flushed points stay
    # A writer that was only slow comes back: its next heartbeat revives the run.
    monkeypatch.setattr(registry, "_now", lambda: real_now + timedelta(seconds=32))
    assert registry.beat(info.run_id, 1) is True
    assert registry.get_run(info.run_id).status == RUNNING


def test_mark_stale_killed_with_an_explicit_timeout(registry):
    info = make_info()
    registry.start_run(info, heartbeat_timeout_s=3600)
    assert registry.mark_stale_killed(timeout_s=3600) == []
    assert registry.mark_stale_killed(timeout_s=0) == [info.run_id]
    assert registry.run_status(info.run_id) == KILLED


def test_to_pandas(registry):
    pd = pytest.importorskip("pandas")
    record_run(registry, make_info(), {"loss": [(0, 1.0)]})
    df = registry.runs().to_pandas()
    assert isinstance(df, pd.DataFrame) and df.loc[0, "metrics.loss"] == 1.0 and "params.model.d_model" in df


def test_to_pandas_without_pandas_says_what_to_install(registry, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pandas(name, *a, **k):
        if name == "pandas":
            raise ImportError("no pandas")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match=r"archspec\[pandas\]"):
        registry.runs().to_pandas()


@pytest.mark.parametrize("url, fragment", [
    ("not a url", "invalid registry URL"),
    ("nosuchdb://x/y", "no database driver"),
    ("postgresql+psycopg://nobody@127.0.0.1:1/nothing", "cannot open registry"),
])
def test_bad_urls_are_user_errors(url, fragment):
    with pytest.raises(UserError, match=fragment):
        Registry(url)


def test_not_a_database_is_a_user_error(tmp_path):
    bad = tmp_path / "junk.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError, match="cannot open registry"):
        Registry(f"sqlite:///{bad}")


def test_password_is_not_echoed():
    with pytest.raises(UserError) as e:
        Registry("postgresql+psycopg://user:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in str(e.value)


def test_a_run_id_longer_than_any_id_is_unknown_not_a_database_error(registry):
    """A 60,000-character "prefix" once reached SQLite's LIKE ('pattern too complex'): exit 1 and a 500 in the UI."""
    record_run(registry, make_info())
    with pytest.raises(UserError, match="run ids are 16 characters"):
        registry.get_run("a" * 60_000)
