"""Deletes stay inside what archspec created (issue 42): `gc --apply` and `runs delete` share one check
(archspec.registry.housekeeping.confined) on the resolved path, and `remove_with_rows` checks it again at the moment
of acting. A tampered or hand-edited registry row naming a path outside every run directory, a checkpoint that is a
link pointing out, a file archspec does not name a checkpoint: left alone, with one line saying why."""

from __future__ import annotations

import os
import signal

import pytest

from archspec.cli import main
from archspec.errors import UserError

from .helpers import populate
from .test_housekeeping import run_cli, run_dir


@pytest.fixture
def data(registry, registry_url):
    return registry, registry_url, populate(registry)


def _victim(tmp_path, name="checkpoint.pt"):
    """A directory archspec did not create, holding a user's files, one named as the row names."""
    v = tmp_path / "victim"
    v.mkdir(exist_ok=True)
    (v / "notes.txt").write_text("mine")
    (v / name).write_bytes(b"precious" * 100)
    return v / name


@pytest.mark.parametrize("how", ["outside", "other-name", "link-out", "in-cwd"])
def test_gc_leaves_alone_what_no_run_directory_holds(data, capsys, tmp_path, monkeypatch, how):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama0"])
    if how == "outside":  # a row naming a file in a directory no run records its module in
        target = _victim(tmp_path)
        reg.add_artifact(ids["llama0"], "checkpoint", str(target))
    elif how == "other-name":  # inside the run directory, but not a name archspec gives a checkpoint
        target = d / "tokenizer.json"
        target.write_text("{}")
        reg.add_artifact(ids["llama0"], "checkpoint", str(target))
    elif how == "link-out":  # the recorded checkpoint is a link to a file outside
        target = _victim(tmp_path, "weights.bin")
        (d / "checkpoint.pt").unlink()
        (d / "checkpoint.pt").symlink_to(target)
    else:  # a run "directory" that is the working directory
        monkeypatch.chdir(tmp_path / "runs")
        target = tmp_path / "runs" / "checkpoint.pt"
        target.write_bytes(b"x" * 10)
        (tmp_path / "runs" / "m.py").write_text("#")
        reg.add_artifact(ids["llama0"], "model", str(tmp_path / "runs" / "m.py"))
        reg.add_artifact(ids["llama0"], "checkpoint", str(target))
    code, out, err = run_cli(capsys, "gc", "--keep", "none", "--apply", "--registry", url)
    assert code == 0, err
    assert target.exists() and (how in ("other-name", "in-cwd") or (target.parent / "notes.txt").exists())
    line = [x for x in err.splitlines() if "left alone" in x]
    assert len(line) == 1, err
    assert str(d / "checkpoint.pt" if how == "link-out" else target) in line[0]
    if how != "link-out":
        assert not (d / "checkpoint.pt").exists()  # the run's own checkpoint is freed as before


def test_gc_still_frees_a_checkpoint_in_a_run_directory_reached_through_a_link(data, capsys, tmp_path):
    """runs/ on another disk (a link to it) is a user's layout, not an escape: the resolved directory is a run
    directory, and it is that one gc acts on."""
    reg, url, ids = data
    real_root = tmp_path / "disk"
    real_root.mkdir()
    (tmp_path / "runs").symlink_to(real_root)
    d = run_dir(reg, tmp_path, ids["llama0"])  # tmp_path/runs/... through the link
    code, out, err = run_cli(capsys, "gc", "--keep", "none", "--apply", "--registry", url)
    assert code == 0 and "in 1 checkpoint" in out, err
    assert not (real_root / d.name / "checkpoint.pt").exists() and (real_root / d.name / "llama.py").exists()


def test_delete_refuses_a_recorded_directory_that_is_a_link_out(data, capsys, tmp_path):
    reg, url, ids = data
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "llama.py").write_text("#")
    (victim / "checkpoint.pt").write_bytes(b"x")
    link = tmp_path / "runs" / "llama-x"
    link.parent.mkdir()
    link.symlink_to(victim)
    reg.add_artifact(ids["llama1"], "model", str(link / "llama.py"))
    code, _, err = run_cli(capsys, "runs", "delete", ids["llama1"], "--yes", "--registry", url)
    assert code == 2 and "is a link" in err and len(err.strip().splitlines()) == 1
    assert (victim / "llama.py").exists()


def test_a_link_put_in_place_after_the_check_is_refused_at_the_moment_of_acting(tmp_path):
    from archspec.registry.housekeeping import remove_with_rows

    d = tmp_path / "runs" / "r"
    d.mkdir(parents=True)
    (d / "checkpoint.pt").write_bytes(b"x")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "checkpoint.pt").write_bytes(b"precious")
    planned = d.resolve() / "checkpoint.pt"
    os.rename(d, tmp_path / "runs" / "moved")  # swapped for a link between the plan and the act
    d.symlink_to(victim)
    rows = []
    with pytest.raises(UserError, match="changed since it was checked"):
        remove_with_rows([planned], lambda: rows.append(1))
    assert rows == [] and (victim / "checkpoint.pt").read_bytes() == b"precious"


def test_runs_delete_interrupted_after_it_finished_says_what_it_did(data, capsys, tmp_path, monkeypatch):
    reg, url, ids = data
    d = run_dir(reg, tmp_path, ids["llama1"])
    from archspec.registry.store import Registry

    real = Registry.delete_runs

    def delete_then_interrupt(self, run_ids):
        out = real(self, run_ids)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the deletion is held; acted on once it is complete
        return out

    monkeypatch.setattr(Registry, "delete_runs", delete_then_interrupt)
    code = main(["runs", "delete", ids["llama1"], "--yes", "--registry", url])
    out, err = capsys.readouterr()
    assert code == 143 and "terminated" in err
    assert "deleted 1 run" in out and not d.exists()
