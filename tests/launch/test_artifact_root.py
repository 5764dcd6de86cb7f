"""Artifact paths under a declared root are stored relative to it and resolve against each reader's own root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.errors import UserError
from archspec.registry import Registry
from archspec.registry.artifact_paths import MARKER, ROOT_VAR, resolved, stored
from tests.registry.helpers import create_registry, make_info, make_spec

parts = st.lists(st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="-_."), min_size=1,
                         max_size=12).filter(lambda p: p not in (".", "..")), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(rel=parts)
def test_a_path_under_the_root_round_trips_through_another_hosts_root(rel):
    writer_root, reader_root = "/mnt/shared", "/lustre/lab"
    old = os.environ.get(ROOT_VAR)
    try:
        os.environ[ROOT_VAR] = writer_root
        text = stored(os.path.join(writer_root, *rel))
        assert text == MARKER + "/".join(rel)
        os.environ[ROOT_VAR] = reader_root
        assert resolved(text) == os.path.join(reader_root, *rel)
        outside = stored(os.path.join("/elsewhere", *rel))  # outside the root: absolute, as recorded
        assert outside == os.path.join("/elsewhere", *rel) and resolved(outside) == outside
    finally:
        if old is None:
            os.environ.pop(ROOT_VAR, None)
        else:
            os.environ[ROOT_VAR] = old


def test_the_registry_stores_relative_and_resolves_per_host(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    create_registry(url)
    reg = Registry(url)
    info = make_info(make_spec("a"), seed=0, data_hash="d")
    reg.start_run(info, heartbeat_timeout_s=60)
    monkeypatch.setenv(ROOT_VAR, "/mnt/shared")
    reg.add_artifact(info.run_id, "checkpoint", "/mnt/shared/runs/a/checkpoint.pt")
    reg.add_artifact(info.run_id, "model", "/opt/local/model.py")
    monkeypatch.setenv(ROOT_VAR, "/lustre/lab")  # another host, the same storage mounted elsewhere
    assert reg.artifacts(info.run_id) == [("checkpoint", "/lustre/lab/runs/a/checkpoint.pt"),
                                          ("model", "/opt/local/model.py")]
    assert [p for *_, p in reg.all_artifacts()] == ["/lustre/lab/runs/a/checkpoint.pt", "/opt/local/model.py"]
    reg.forget_artifacts({info.run_id: ["/lustre/lab/runs/a/checkpoint.pt"]})  # as read on this host
    assert reg.artifacts(info.run_id) == [("model", "/opt/local/model.py")]
    reg.add_artifact(info.run_id, "checkpoint", "/lustre/lab/runs/a/checkpoint.pt")
    monkeypatch.delenv(ROOT_VAR)
    with pytest.raises(UserError, match=ROOT_VAR):  # a host that declared no root: named, never guessed
        reg.artifacts(info.run_id)


def test_a_relative_root_is_refused(monkeypatch):
    monkeypatch.setenv(ROOT_VAR, "shared")
    with pytest.raises(UserError, match="absolute"):
        stored("/x/y")


def test_the_artifact_root_option_leaves_the_environment_as_it_was(tmp_path, monkeypatch, capsys):
    """--artifact-root holds for the command only: refused (relative) or accepted, the variable is as before after it."""
    import os

    from archspec.cli import main

    monkeypatch.delenv("ARCHSPEC_ARTIFACT_ROOT", raising=False)
    spec = Path(__file__).resolve().parent.parent.parent / "specs" / "llama-like-tiny.yaml"
    assert main(["train", str(spec), "--artifact-root", "not/absolute", "--steps", "1"]) == 2
    assert "must be an absolute path" in capsys.readouterr().err
    assert "ARCHSPEC_ARTIFACT_ROOT" not in os.environ
    monkeypatch.chdir(tmp_path)
    assert main(["ablate", str(tmp_path / "missing.yaml"), "--artifact-root", str(tmp_path), "--status"]) == 2
    capsys.readouterr()
    assert "ARCHSPEC_ARTIFACT_ROOT" not in os.environ
