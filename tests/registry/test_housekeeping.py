"""Living with many runs: `runs tag|note|rename|delete`, `gc`, reaping a dead local writer by pid, checked columns."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from alembic import command
from sqlalchemy import inspect

from archspec.cli import main
from archspec.registry import Registry
from archspec.registry.migrate import alembic_config, head_revision

from .helpers import make_info, make_spec, populate, record_run, writer_tags


@pytest.fixture
def data(registry, registry_url):
    return registry, registry_url, populate(registry)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_dir(reg, tmp_path, run_id: str, name: str = "llama", extra: dict[str, str] | None = None):
    """A run directory as the loop leaves it (module, checkpoint, run.json), recorded as the run's artifacts."""
    d = tmp_path / "runs" / f"{name}-{run_id}"
    d.mkdir(parents=True)
    (d / f"{name}.py").write_text("# generated\n")
    (d / "checkpoint.pt").write_bytes(b"\0" * 2048)
    (d / "run.json").write_text("{}")
    for file, text in (extra or {}).items():
        (d / file).write_text(text)
    reg.add_artifact(run_id, "model", str(d / f"{name}.py"))
    reg.add_artifact(run_id, "checkpoint", str(d / "checkpoint.pt"))
    return d


def ids_of(capsys, url: str, where: str) -> list[str]:
    code, out, err = run_cli(capsys, "runs", "list", "--registry", url, "--where", where, "--format", "json")
    assert code == 0, err
    return [r["id"] for r in json.loads(out)]


# ── tags, notes, names ──────────────────────────────────────────────────────────────────────────────────────────


def test_tag_sets_removes_filters_and_shows(data, capsys):
    reg, url, ids = data
    run = ids["llama0"]
    code, out, err = run_cli(capsys, "runs", "tag", run[:8], "keep=yes", "lr_bad=1", "--registry", url)
    assert code == 0 and "keep=yes" in out, err
    assert ids_of(capsys, url, "tags.keep = 'yes'") == [run]
    code, out, err = run_cli(capsys, "runs", "tag", run, "keep=", "--remove", "lr_bad", "--registry", url)
    assert code == 0 and "removed keep" in out and "removed lr_bad" in out, err
    tags = reg.get_run(run).tags
    assert "keep" not in tags and "lr_bad" not in tags and tags["note"] == "baseline"  # others untouched
    code, out, _ = run_cli(capsys, "runs", "show", run, "--registry", url)
    assert "note=baseline" in out


@pytest.mark.parametrize("args, message", [
    (["pid=1"], "written by the training loop"),
    (["no equals"], "is not KEY=VALUE"),
    (["bad key=1"], "tag key"),
    (["k=a\x1bb"], "control character"),
    ([], "needs KEY=VALUE"),
    (["k=1", "--remove", "k"], "both set and removed"),
])
def test_tag_refuses_bad_input_with_one_line(data, capsys, args, message):
    reg, url, ids = data
    before = reg.get_run(ids["llama0"]).tags
    code, out, err = run_cli(capsys, "runs", "tag", ids["llama0"], *args, "--registry", url)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert reg.get_run(ids["llama0"]).tags == before


def test_user_tags_and_notes_survive_a_restart_the_writer_tags_do_not(registry, registry_url, capsys):
    info = make_info(tags={"pid": "1", "device": "cpu"})
    record_run(registry, info, status="FAILED")
    assert run_cli(capsys, "runs", "tag", info.run_id, "why=oom", "--registry", registry_url)[0] == 0
    assert run_cli(capsys, "runs", "note", info.run_id, "retry with bs 8", "--registry", registry_url)[0] == 0
    registry.start_run(make_info(tags={"device": "cuda"}), heartbeat_timeout_s=60)
    run = registry.get_run(info.run_id)
    assert run.tags == {"device": "cuda", "why": "oom"} and run.note == "retry with bs 8"


def test_note_latest_shown_all_kept_and_filterable(data, capsys):
    reg, url, ids = data
    run = ids["gpt0"]
    assert run_cli(capsys, "runs", "note", run, "first try", "--registry", url)[0] == 0
    assert run_cli(capsys, "runs", "note", run, "lr too high\nsee wandb", "--registry", url)[0] == 0
    code, out, _ = run_cli(capsys, "runs", "show", run, "--registry", url)
    assert "lr too high" in out and "first try" not in out
    code, out, _ = run_cli(capsys, "runs", "show", run, "--registry", url, "--format", "json")
    assert [n["text"] for n in json.loads(out)["notes"]] == ["first try", "lr too high\nsee wandb"]
    assert ids_of(capsys, url, "note like '%LR TOO%'") == [run]
    assert ids_of(capsys, url, "note like '%first%'") == []  # the latest note is the run's note
    assert set(ids_of(capsys, url, "note is null")) == set(ids.values()) - {run}
    code, _, err = run_cli(capsys, "runs", "note", run, "  ", "--registry", url)
    assert code == 2 and "note is empty" in err


def test_rename_changes_the_shown_name_never_the_id(data, capsys):
    reg, url, ids = data
    run = ids["llama0"]
    code, out, err = run_cli(capsys, "runs", "rename", run, "llama-baseline", "--registry", url)
    assert code == 0, err
    row = reg.get_run(run)
    assert row.id == run and row.name == "llama-baseline" and row.spec_name == "llama"
    assert ids_of(capsys, url, "name = 'llama-baseline'") == [run]
    assert set(ids_of(capsys, url, "spec_name = 'llama'")) == {run, ids["llama1"]}
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", url)
    assert "llama-baseline" in out
    assert run_cli(capsys, "runs", "rename", run, "-", "--registry", url)[0] == 0
    assert reg.get_run(run).name == "llama"
    code, _, err = run_cli(capsys, "runs", "rename", run, "a\nb", "--registry", url)
    assert code == 2 and "a name is one line" in err
    code, _, err = run_cli(capsys, "runs", "rename", run, "x" * 129, "--registry", url)
    assert code == 2 and "at most 128" in err


# ── delete ──────────────────────────────────────────────────────────────────────────────────────────────────────


def test_delete_refuses_a_finished_sweep_run_without_force(data, capsys, tmp_path):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama0"])
    code, out, err = run_cli(capsys, "runs", "delete", ids["llama0"], "--yes", "--registry", url)
    assert code == 2 and "belongs to sweep s1" in err and "--force" in err
    assert d.is_dir() and reg.get_run(ids["llama0"])
    code, out, err = run_cli(capsys, "runs", "delete", ids["llama0"], "--yes", "--force", "--registry", url)
    assert code == 0, err
    assert str(d) in out and "KiB" in out and not d.exists()
    assert ids_of(capsys, url, f"id = '{ids['llama0']}'") == [] and reg.count_metrics(ids["llama0"]) == 0
    assert reg.specs(where="name = 'llama'")  # the spec stays


def test_delete_refuses_a_live_running_run(data, capsys):
    reg, url, ids = data
    code, _, err = run_cli(capsys, "runs", "delete", ids["wide0"], "--yes", "--force", "--registry", url)
    assert code == 2 and "RUNNING" in err and reg.get_run(ids["wide0"]).status == "RUNNING"


def test_delete_asks_and_a_no_deletes_nothing(data, capsys, tmp_path, monkeypatch):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama1"])  # FAILED: no --force needed
    code, out, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--dry-run", "--registry", url)
    assert code == 0 and "would delete 1 run" in out and d.is_dir()
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    code, out, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--registry", url)
    assert code == 1 and "nothing deleted" in out and d.is_dir() and reg.get_run(ids["llama1"])
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no answer at all (a script without --yes)
    code, out, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--registry", url)
    assert code == 2 and "--yes" in err and d.is_dir()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    code, out, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--registry", url)
    assert code == 0 and "deleted 1 run" in out and not d.exists(), err


def test_delete_is_all_or_nothing_when_the_database_fails(data, capsys, tmp_path, monkeypatch):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama1"])
    from archspec.registry.writes import RegistryWriter

    def broken(self, run_ids):
        raise RuntimeError("disk I/O error")

    monkeypatch.setattr(RegistryWriter, "delete_runs", broken)
    code, out, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--yes", "--registry", url)
    assert code == 1 and "nothing deleted" in err and "Traceback" not in err
    assert sorted(p.name for p in d.iterdir()) == ["checkpoint.pt", "llama.py", "run.json"]
    assert [p.name for p in d.parent.iterdir()] == [d.name]  # nothing left aside
    assert reg.get_run(ids["llama1"]).status == "FAILED"


def test_delete_leaves_a_directory_archspec_did_not_create(data, capsys, tmp_path):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama1"], extra={"thesis.tex": "mine"})
    code, _, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--yes", "--registry", url)
    assert code == 2 and "thesis.tex" in err and "--keep-files" in err and (d / "thesis.tex").exists()
    code, out, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--yes", "--keep-files", "--registry", url)
    assert code == 0 and (d / "checkpoint.pt").exists() and ids_of(capsys, url, f"id = '{ids['llama1']}'") == []


def test_delete_refuses_a_directory_that_holds_no_recorded_file(data, capsys, tmp_path):
    reg, url, ids = data
    d = tmp_path / "elsewhere"
    d.mkdir()
    reg.add_artifact(ids["llama1"], "checkpoint", str(d / "checkpoint.pt"))  # recorded, but not there
    (d / "run.json").write_text("{}")
    code, _, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--yes", "--registry", url)
    assert code == 2 and "none of the run's recorded files" in err and d.is_dir()


# ── gc ──────────────────────────────────────────────────────────────────────────────────────────────────────────


def test_gc_is_a_dry_run_until_apply_and_keeps_the_latest(data, capsys, tmp_path):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama0"])
    old = tmp_path / "older" / "checkpoint.pt"
    old.parent.mkdir()
    old.write_bytes(b"\0" * 4096)
    (old.parent / "llama.py").write_text("# generated\n")  # an earlier run directory of the run: its module too
    reg.add_artifact(ids["llama0"], "model", str(old.parent / "llama.py"))
    stray = d / "checkpoint-copy.pt"  # not recorded: never touched
    stray.write_bytes(b"x")
    reg.add_artifact(ids["llama0"], "checkpoint", str(old))  # recorded last: the latest
    running = run_dir(reg, tmp_path, ids["wide0"], name="wide")
    code, out, err = run_cli(capsys, "gc", "--registry", url)
    assert code == 0 and str(d / "checkpoint.pt") in out and "would free 2.0 KiB in 1 checkpoint" in out, err
    assert (d / "checkpoint.pt").exists()
    code, out, err = run_cli(capsys, "gc", "--apply", "--registry", url)
    assert code == 0 and "freed 2.0 KiB in 1 checkpoint" in out
    assert not (d / "checkpoint.pt").exists() and old.exists() and stray.exists()
    assert [k for k, _ in reg.artifacts(ids["llama0"])].count("checkpoint") == 1
    code, out, _ = run_cli(capsys, "gc", "--keep", "none", "--apply", "--registry", url)
    assert code == 0 and not old.exists() and (running / "checkpoint.pt").exists()  # a RUNNING run: never
    assert reg.get_run(ids["llama0"]).status == "FINISHED"


def test_gc_best_keeps_the_best_run_of_a_model(registry, registry_url, capsys, tmp_path):
    spec = make_spec("m")
    good = record_run(registry, make_info(spec, seed=0), {"val_loss": [(0, 3.0), (10, 2.0)]})
    bad = record_run(registry, make_info(spec, seed=1), {"val_loss": [(0, 3.0), (10, 2.5)]})
    dg, db = run_dir(registry, tmp_path, good, "m"), run_dir(registry, tmp_path, bad, "m")
    code, out, err = run_cli(capsys, "gc", "--keep", "best", "--apply", "--registry", registry_url)
    assert code == 0 and f"run {good} has the best val_loss of its model and data" in out, err
    assert (dg / "checkpoint.pt").exists() and not (db / "checkpoint.pt").exists() and (db / "m.py").exists()
    code, _, err = run_cli(capsys, "gc", "--keep", "best", "--metric", "val_los", "--registry", registry_url)
    assert code == 2 and "did you mean val_loss" in err


# ── reaping a dead writer by pid; checked columns ───────────────────────────────────────────────────────────────


def dead_pid() -> dict[str, str]:
    """The writer tags of a process of this host that has ended."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    tags = writer_tags(p.pid)
    p.communicate(b"")
    return tags


def test_a_dead_local_writer_is_stale_at_once_and_reaped(registry, registry_url, capsys):
    other = make_info(seed=1, tags=dead_pid())  # another host's pid says nothing here
    record_run(registry, other, status="RUNNING", heartbeat_timeout_s=3600.0)
    info = make_info(tags=dead_pid())
    info.host = socket.gethostname()
    record_run(registry, info, status="RUNNING", heartbeat_timeout_s=3600.0)  # heartbeat fresh
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", registry_url)
    assert "RUNNING (stale)" in out and registry.get_run(info.run_id).status == "RUNNING"  # reads never write
    assert registry.run_state(info.run_id) == ("RUNNING", True)
    code, out, err = run_cli(capsys, "runs", "reap", "--registry", registry_url)
    assert code == 0 and out.split() == [info.run_id] and "marked 1 stale run KILLED" in err
    run = registry.get_run(info.run_id)
    assert run.status == "KILLED" and "is gone" in run.error
    assert registry.get_run(other.run_id).status == "RUNNING"
    again = make_info(seed=2, tags=dead_pid())  # every command that reaps: here a run start
    again.host = socket.gethostname()
    record_run(registry, again, status="RUNNING")
    record_run(registry, make_info(seed=3), status="FINISHED")
    assert registry.get_run(again.run_id).status == "KILLED"


def test_columns_are_checked_like_where_fields(data, capsys):
    reg, url, ids = data
    code, _, err = run_cli(capsys, "runs", "list", "-c", "summary.tok_ss", "--registry", url)
    assert code == 2 and "did you mean summary.tok_s" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "runs", "list", "-c", "metrics.val_los", "--registry", url)
    assert code == 2 and "did you mean metrics.val_loss" in err
    code, out, err = run_cli(capsys, "runs", "list", "-c", "summary.tok_s,params.model.n_layers", "--registry", url)
    assert code == 0 and "summary.tok_s" in out, err
    code, _, err = run_cli(capsys, "specs", "list", "-c", "params.model.d_modl", "--registry", url)
    assert code == 2 and "did you mean params.model.d_model" in err
    code, out, _ = run_cli(capsys, "runs", "list", "--help")
    assert "summary.tokens_per_s" in out and "tok_s" not in out.replace("tokens_per_s", "")


# ── migration 0005 ──────────────────────────────────────────────────────────────────────────────────────────────


def test_migration_0005_up_and_down_keeps_the_runs(registry_url, capsys):
    reg = Registry(registry_url)
    info = make_info()
    record_run(reg, info, {"val_loss": [(0, 2.0)]})
    reg.add_note(info.run_id, "hello")
    reg.rename_run(info.run_id, "renamed")
    with reg.engine.connect().execution_options(archspec_write=True) as conn, conn.begin():
        command.downgrade(alembic_config(conn), "0004")
    assert "run_notes" not in inspect(reg.engine).get_table_names()
    reg.close()
    with Registry(registry_url) as old:
        assert old.upgrade() == ("0004", head_revision())
        run = old.get_run(info.run_id)
        assert run.name == run.spec_name == "tiny" and run.note is None and run.metrics == {"val_loss": 2.0}


def test_the_report_shows_a_runs_note_escaped(tmp_path):
    from archspec.ablate.report import RunResult, VariantResult, render_html, table_rows

    runs = [RunResult("r0", 0, "FINISHED", 3.0, 1000.0, [(1, 3.0)], 64, {"val_loss": 3.0}, note="lr <b>too</b> high"),
            RunResult("r1", 1, "FINISHED", 3.1, 1000.0, [(1, 3.1)], 64, {"val_loss": 3.1})]
    v = VariantResult(0, "base", {}, 100, 100, 600, 512, runs)
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG")
    html = render_html("t", table_rows([v], 0), png, [v], {}, [])
    assert "note: <em>lr &lt;b&gt;too&lt;/b&gt; high</em>" in html and html.count("note:") == 1


def test_the_help_texts_own_example_column_is_suggested(registry, registry_url, capsys):
    record_run(registry, make_info(), {"val_loss": [(0, 2.0)]}, summary={"tokens_per_s": 10.0, "tokens": 64.0})
    code, _, err = run_cli(capsys, "runs", "list", "-c", "summary.tok_s", "--registry", registry_url)
    assert code == 2 and "did you mean summary.tokens_per_s?" in err
    code, out, err = run_cli(capsys, "runs", "list", "-c", "summary.tokens_per_s", "--registry", registry_url)
    assert code == 0 and "summary.tokens_per_s" in out and " 10" in out, err
    code, _, err = run_cli(capsys, "runs", "list", "--sort", "-summary.tok_s", "--registry", registry_url)
    assert code == 2 and "did you mean summary.tokens_per_s?" in err


def test_dry_runs_are_reads_and_create_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'none' / 'archspec.db'}"
    code, out, err = run_cli(capsys, "gc", "--keep", "none", "--registry", url)
    assert code == 0 and "would free 0 B in 0 checkpoints" in out, err
    code, _, err = run_cli(capsys, "runs", "delete", "abcd1234", "--dry-run", "--registry", url)
    assert code == 2 and "no run" in err
    assert not (tmp_path / "none").exists()


# ── review fixes: gc and delete around other runs, archspec's files, interruptions, guards ───────────────────────


def test_gc_never_frees_a_checkpoint_in_a_directory_an_unfinished_run_uses(registry, registry_url, capsys, tmp_path):
    """`--resume A/checkpoint.pt --set train.steps=...` starts run B writing into A's directory; B records its
    checkpoint only when it finishes, but its other files are recorded there already."""
    spec = make_spec("m")
    a = record_run(registry, make_info(spec, seed=0), {"val_loss": [(0, 3.0)]})
    d = run_dir(registry, tmp_path, a, "m")
    b = record_run(registry, make_info(spec, seed=1), status="RUNNING")
    registry.add_artifact(b, "model", str(d / "m.py"))
    code, out, err = run_cli(capsys, "gc", "--keep", "none", "--apply", "--registry", registry_url)
    assert code == 0 and "freed 0 B in 0 checkpoints" in out, (out, err)
    assert (d / "checkpoint.pt").exists()


def test_delete_two_runs_sharing_a_directory_deletes_it_once(registry, registry_url, capsys, tmp_path):
    spec = make_spec("m")
    a = record_run(registry, make_info(spec, seed=0), status="FAILED")
    b = record_run(registry, make_info(spec, seed=1), status="FAILED")
    d = run_dir(registry, tmp_path, a, "m")
    registry.add_artifact(b, "checkpoint", str(d / "checkpoint.pt"))
    code, out, err = run_cli(capsys, "runs", "delete", a, b, "--dry-run", "--registry", registry_url)
    assert code == 0 and out.count(str(d)) == 1 and "2 runs and 2.0 KiB of files" in out, (out, err)
    code, out, err = run_cli(capsys, "runs", "delete", a, b, "--yes", "--registry", registry_url)
    assert code == 0 and "deleted 2 runs and 2.0 KiB" in out and not d.exists(), err
    assert registry.runs() == []


@pytest.mark.parametrize("make, foreign", [
    (lambda d: (d / "__pycache__").mkdir() or (d / "__pycache__" / "thesis.tex").write_text("x"), "thesis.tex"),
    (lambda d: (d / "checkpoint-step00000004.dcp").mkdir() or (d / "checkpoint-step00000004.dcp" / "mine").mkdir(),
     "mine"),
    (lambda d: (d / "checkpoint-step00000004.dcp").write_text("a file, not DCP's directory"), "checkpoint-step"),
    (lambda d: (d / "tokenizer.json").mkdir(), "tokenizer.json/"),
    (lambda d: (d / "notes.tmp2024.txt").write_text("mine"), "notes.tmp2024.txt"),
    (lambda d: (d / ".draft.tmp").write_text("mine"), ".draft.tmp"),
])
def test_delete_judges_entries_by_type_and_contents_not_name(data, capsys, tmp_path, make, foreign):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama1"])
    make(d)
    code, _, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--yes", "--registry", url)
    assert code == 2 and foreign in err and d.is_dir() and reg.get_run(ids["llama1"])


def test_delete_takes_what_archspec_writes_in_a_run_directory(data, capsys, tmp_path):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama1"], extra={".run.json.123.0123456789ab.tmp": "", "llama.py.tmp4242": "",
                                                       "metrics.jsonl": ""})
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / "llama.cpython-312.pyc").write_bytes(b"")
    shards = d / "checkpoint-step00000004.dcp"
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"")
    (shards / "__0_0.distcp").write_bytes(b"")
    code, _, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--yes", "--registry", url)
    assert code == 0 and not d.exists(), err


def test_an_interrupt_between_renames_puts_everything_back_and_says_what_it_could_not(tmp_path, monkeypatch, capsys):
    from archspec.registry import housekeeping

    paths = [tmp_path / n for n in ("a", "b", "c")]
    for p in paths:
        p.mkdir()
    real, calls = housekeeping.os.rename, []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C while moving the third aside
        if len(calls) == 4:
            raise PermissionError(13, "Permission denied", str(src))  # putting b back fails
        real(src, dst)

    monkeypatch.setattr(housekeeping.os, "rename", rename)
    rows = []
    with pytest.raises(KeyboardInterrupt):
        housekeeping.remove_with_rows(paths, lambda: rows.append(1))
    err = capsys.readouterr().err
    assert rows == [] and "could not be renamed back" in err and ".b.deleting-" in err
    assert (tmp_path / "a").is_dir() and (tmp_path / "c").is_dir() and not (tmp_path / "b").exists()  # a: restored


def test_an_interrupt_during_the_transaction_puts_everything_back(tmp_path):
    from archspec.registry.housekeeping import remove_with_rows

    paths = [tmp_path / "a", tmp_path / "b"]
    for p in paths:
        p.mkdir()

    def rows():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        remove_with_rows(paths, rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_gc_frees_a_sharded_checkpoint_with_its_directory(data, capsys, tmp_path):
    import torch

    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama0"])
    shards = d / "checkpoint-step00000004.dcp"
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"m" * 100)
    (shards / "__0_0.distcp").write_bytes(b"s" * 4096)
    torch.save({"step": 4, "sharded": shards.name}, d / "checkpoint.pt")
    other = d / "checkpoint-step00000002.dcp"  # an earlier step's directory the checkpoint does not name: stays
    other.mkdir()
    code, out, err = run_cli(capsys, "gc", "--keep", "none", "--apply", "--registry", url)
    assert code == 0 and "freed 1 checkpoint" not in out and "in 1 checkpoint" in out, err
    assert not (d / "checkpoint.pt").exists() and not shards.exists() and other.is_dir()


def test_gc_keeps_a_checkpoint_beside_shards_it_cannot_read(data, capsys, tmp_path):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama0"])  # checkpoint.pt holds zeros: not readable
    (d / "checkpoint-step00000004.dcp").mkdir()
    code, out, err = run_cli(capsys, "gc", "--keep", "none", "--apply", "--registry", url)
    assert code == 0 and "in 0 checkpoints" in out and (d / "checkpoint.pt").exists(), err


def test_reap_by_pid_needs_this_namespace_and_boot_and_notices_a_reused_pid(registry, registry_url, capsys):
    from archspec.registry.values import writer_gone, writer_identity

    host = socket.gethostname()
    dead = dead_pid()
    assert writer_gone(host, dead)
    assert not writer_gone(host, {"pid": dead["pid"]})  # an old run: no identity tags, the heartbeat tells
    assert not writer_gone(host, {**dead, "pid_namespace": "4026531999"})  # another container's pid
    assert not writer_gone(host, {**dead, "boot_id": "0" * 32})  # a cloned VM, or before a reboot
    me = writer_identity()
    parent = {**me, "pid": str(os.getppid())}
    parent["pid_start"] = writer_tags(os.getppid())["pid_start"]
    assert not writer_gone(host, parent)  # alive, the same process
    assert writer_gone(host, {**parent, "pid_start": "1"})  # alive, but another process holds the pid now
    info = make_info(tags={**parent, "pid_namespace": "1"})
    info.host = host
    record_run(registry, info, status="RUNNING", heartbeat_timeout_s=3600.0)
    code, _, err = run_cli(capsys, "runs", "reap", "--registry", registry_url)
    assert code == 0 and registry.get_run(info.run_id).status == "RUNNING", err  # another namespace: heartbeat only


def test_delete_wants_a_heartbeat_stale_running_run_reaped_first(registry, registry_url, capsys):
    info = make_info()  # on another host: only its heartbeat says it is dead
    record_run(registry, info, status="RUNNING", heartbeat_timeout_s=0.001)
    code, _, err = run_cli(capsys, "runs", "delete", info.run_id, "--yes", "--registry", registry_url)
    assert code == 2 and "runs reap" in err and registry.get_run(info.run_id).status == "RUNNING"
    code, _, err = run_cli(capsys, "runs", "delete", info.run_id, "--yes", "--force", "--registry", registry_url)
    assert code == 0, err
    info = make_info(seed=1)
    record_run(registry, info, status="RUNNING", heartbeat_timeout_s=0.001)
    time.sleep(0.01)
    assert registry.reap() == [info.run_id]
    code, _, err = run_cli(capsys, "runs", "delete", info.run_id, "--yes", "--registry", registry_url)
    assert code == 0, err


@pytest.mark.parametrize("where", ["cwd", "home", "registry_link"])
def test_delete_refuses_the_cwd_home_and_the_registry_however_named(registry, registry_url, capsys, tmp_path,
                                                                     monkeypatch, where):
    run = record_run(registry, make_info(), status="FAILED")
    d = tmp_path / "runs" / "r"
    d.mkdir(parents=True)
    (d / "checkpoint.pt").write_bytes(b"\0")
    recorded = d
    if where == "cwd":
        monkeypatch.chdir(d)
    elif where == "home":
        monkeypatch.setenv("HOME", str(d))
    else:  # the registry opened through a link to its directory: abspath would not see it is inside `recorded`
        if registry._file is None:
            pytest.skip("a PostgreSQL registry is no file in a directory")
        recorded = registry._file.parent
        (recorded / "checkpoint.pt").write_bytes(b"\0")
        (tmp_path / "link").symlink_to(recorded)
        registry_url = f"sqlite:///{tmp_path / 'link' / registry._file.name}"
    registry.add_artifact(run, "checkpoint", str(recorded / "checkpoint.pt"))
    code, _, err = run_cli(capsys, "runs", "delete", run, "--yes", "--registry", registry_url)
    assert code == 2 and "not deleting it" in err, err
    assert (recorded / "checkpoint.pt").exists() and registry.get_run(run)


def test_gc_apply_with_nothing_to_free_creates_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'typo' / 'archspec.db'}"
    code, out, err = run_cli(capsys, "gc", "--apply", "--registry", url)
    assert code == 0 and "freed 0 B in 0 checkpoints" in out, err
    code, out, err = run_cli(capsys, "gc", "--keep", "best", "--registry", url)
    assert code == 0, err
    assert not (tmp_path / "typo").exists()


def test_delete_and_gc_dry_runs_leave_the_database_unchanged(data, capsys, tmp_path):
    import hashlib

    reg, url, ids = data
    run_dir(reg, tmp_path, ids["llama0"])
    reg.close()
    db = reg._file

    def digest():
        if db is None:  # PostgreSQL: every row of every table
            import sqlalchemy as sa

            engine = sa.create_engine(url)
            meta = sa.MetaData()
            meta.reflect(engine)
            with engine.connect() as conn:
                rows = {t: sorted(map(repr, conn.execute(sa.select(meta.tables[t])).all())) for t in sorted(meta.tables)}
            engine.dispose()
            return hashlib.sha256(repr(rows).encode()).hexdigest()
        return hashlib.sha256(b"".join(p.read_bytes() for p in (db, db.with_name(db.name + "-wal")) if p.exists()))\
            .hexdigest()

    before = digest()
    for args in (["runs", "delete", ids["llama1"], "--dry-run"], ["gc"], ["gc", "--keep", "none"],
                 ["gc", "--keep", "best"]):
        code, _, err = run_cli(capsys, *args, "--registry", url)
        assert code == 0, (args, err)
    assert digest() == before


@pytest.mark.parametrize("args, code, message", [
    (["--reset"], 0, "→ llama"),
    ([], 2, "needs NEW_NAME"),
    (["new", "--reset"], 2, "not both"),
])
def test_rename_reset_needs_no_name(data, capsys, args, code, message):
    reg, url, ids = data
    run_cli(capsys, "runs", "rename", ids["llama0"], "first", "--registry", url)
    got, out, err = run_cli(capsys, "runs", "rename", ids["llama0"], *args, "--registry", url)
    assert got == code and message in (out if code == 0 else err), (out, err)
    if code:
        assert len(err.strip().splitlines()) == 1 and reg.get_run(ids["llama0"]).name == "first"
    else:
        assert reg.get_run(ids["llama0"]).name == "llama"


@pytest.mark.parametrize("metric", ["", "best.", "val loss"])
def test_gc_best_checks_metric_is_a_metric_key(data, capsys, metric):
    _, url, _ = data
    code, _, err = run_cli(capsys, "gc", "--keep", "best", "--metric", metric, "--registry", url)
    assert code == 2 and "is not a metric key" in err and "no run has" not in err, err


def test_gc_best_compares_runs_on_the_same_data_only(registry, registry_url, capsys, tmp_path):
    spec = make_spec("m")
    good = record_run(registry, make_info(spec, seed=0), {"val_loss": [(0, 2.0)]})
    other = record_run(registry, make_info(spec, seed=1, data_hash="data-v2"), {"val_loss": [(0, 2.5)]})
    dg, do = run_dir(registry, tmp_path, good, "m"), run_dir(registry, tmp_path, other, "m")
    code, out, err = run_cli(capsys, "gc", "--keep", "best", "--apply", "--registry", registry_url)
    assert code == 0 and (dg / "checkpoint.pt").exists() and (do / "checkpoint.pt").exists(), (out, err)
