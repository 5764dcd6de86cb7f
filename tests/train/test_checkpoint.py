"""Checkpoints: atomic writes, safe loading, and every bad file ends in a UserError."""

from __future__ import annotations

import pytest
import torch

from archspec.cli import main
from archspec.errors import UserError
from archspec.train import checkpoint as ckpt
from archspec.train.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from archspec.train.loop import train


def minimal_state(step: int = 1) -> dict:
    return {"spec_hash": "h", "spec": {}, "step": step, "model": {"w": torch.ones(2)},
            "optimizer": {"state": {}, "param_groups": []}, "rng": [ckpt.rng_state()],
            "data": {"epoch": 0, "cursor": 0, "seed": 0, "seq_len": 8, "n_windows": 10}}


def test_save_then_load_with_weights_only(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, minimal_state(3))
    state = load_checkpoint(path)
    assert state["format"] == FORMAT and state["step"] == 3 and torch.equal(state["model"]["w"], torch.ones(2))
    assert load_checkpoint(tmp_path)["step"] == 3  # a run directory works too
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary left behind


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, minimal_state(1))

    def torn_save(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(ckpt.CheckpointWriteError, match=f"cannot write checkpoint {path}: disk full; .* MiB free"):
        save_checkpoint(path, minimal_state(2))
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


class Payload:
    def __reduce__(self):
        return (print, ("code ran while loading",))


@pytest.mark.parametrize("write, message", [
    (lambda p: p.write_bytes(b"\x00garbage" * 10), "not a readable checkpoint"),
    (lambda p: torch.save({"format": FORMAT, "evil": Payload()}, p), "not a readable checkpoint \\(UnpicklingError"),
    (lambda p: torch.save({"model": {}}, p), "not an archspec checkpoint"),
    (lambda p: torch.save({"format": FORMAT, "step": 1}, p), "incomplete checkpoint, missing spec_hash"),
])
def test_bad_files_are_user_errors(tmp_path, write, message):
    path = tmp_path / "checkpoint.pt"
    write(path)
    with pytest.raises(UserError, match=message):
        load_checkpoint(path)


def test_truncated_checkpoint_is_a_user_error(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, minimal_state())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="not a readable checkpoint"):
        load_checkpoint(path)


def test_missing_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such checkpoint file"):
        load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(UserError, match="no such checkpoint file"):
        load_checkpoint(tmp_path)  # a directory without one


def test_resume_refuses_a_checkpoint_of_another_spec(make_spec, tmp_path, cache):
    train(make_spec(steps=2, warmup_steps=1), run_dir=tmp_path / "a", cache=cache)
    with pytest.raises(UserError, match="different model or recipe") as info:
        train(make_spec(steps=4, warmup_steps=1, lr=1e-2), resume=tmp_path / "a", run_dir=tmp_path / "b", cache=cache)
    assert any(p.startswith("train.lr: checkpoint 0.003, now 0.01") for p in info.value.problems)


def test_a_checkpoint_from_before_model_identity_resumes_and_names_do_not_matter(make_spec, tmp_path, cache):
    """Checkpoints written before this change carry a spec_hash over name + model + recipe; they are judged by the
    model and learning recipe in the spec they carry, so they resume under another name or compile setting."""
    first = train(make_spec(steps=4, warmup_steps=1, checkpoint_interval=2), run_dir=tmp_path / "a", cache=cache)
    state = load_checkpoint(tmp_path / "a")
    state["spec_hash"] = "0" * 64  # the old hash: not a model hash
    state["spec"] = {**state["spec"], "name": "called-something-else"}
    state["step"] = 2
    save_checkpoint(first.checkpoint, {k: v for k, v in state.items() if k != "format"})
    spec = make_spec(steps=4, warmup_steps=1, checkpoint_interval=2, compile="none", eval_interval=3)
    resumed = train(spec, resume=tmp_path / "a", cache=cache)
    assert resumed.status == "FINISHED" and resumed.step == 4
    state["spec"] = {k: v for k, v in state["spec"].items() if k != "model"}  # a spec with no model at all
    save_checkpoint(first.checkpoint, {k: v for k, v in state.items() if k != "format"})
    with pytest.raises(UserError, match="names no model.*without --resume"):
        train(spec, resume=tmp_path / "a", cache=cache)


def test_resume_refuses_weights_of_another_shape(make_spec, tmp_path, cache):
    first = train(make_spec(steps=2, warmup_steps=1), run_dir=tmp_path / "a", cache=cache)
    state = load_checkpoint(first.checkpoint)
    state["model"]["tok_emb.weight"] = torch.zeros(3, 3)
    save_checkpoint(first.checkpoint, {k: v for k, v in state.items() if k != "format"})
    with pytest.raises(UserError, match="model weights do not fit this model"):
        train(make_spec(steps=2, warmup_steps=1), resume=first.checkpoint, cache=cache)


def test_cli_resume_from_a_corrupt_file_exits_2_without_traceback(tmp_path, capsys, corpus_dir):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nmodel: {{vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, "
                    f"attention: {{n_heads: 2}}}}\ntrain: {{data: {{corpus: {{kind: files, paths: ['{corpus_dir}']}}}}, "
                    f"batch_size: 2, compile: none}}\n")
    assert main(["train", str(spec), "--steps", "2", "--set", "train.warmup_steps=1", "--resume", str(bad), "-q"]) == 2
    err = capsys.readouterr().err
    assert "not a readable checkpoint" in err and "Traceback" not in err
