"""Ctrl-C never loses progress (issue 22, item 5): an interrupt saves a checkpoint at the last whole step whatever
checkpoint_interval says, never saves half an update, is never swallowed, and the printed command reproduces the run's
own options and continues it exactly."""

from __future__ import annotations

import json
import os
import shlex
import signal

import pytest
import torch

from archspec.cli import main
from archspec.train.checkpoint import load_checkpoint
from archspec.train.loop import Trainer


def _spec(tmp_path, corpus_dir):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nmodel: {{vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, "
                    f"attention: {{n_heads: 2}}, dropout: 0.1}}\ntrain: {{data: {{corpus: {{kind: files, paths: "
                    f"['{corpus_dir}']}}}}, batch_size: 2, seq_len: 16, warmup_steps: 1, eval_tokens: 64}}\n")
    return spec


def _argv(spec, run_dir):
    return ["train", str(spec), "--steps", "5", "--no-compile", "--device", "cpu", "-q", "--set", "train.lr=1e-2",
            "--run-dir", str(run_dir)]


def _interrupt(monkeypatch, method: str, at_call: int):
    """Send this process a real SIGINT from inside Trainer.<method> on its at_call-th call."""
    real, calls = getattr(Trainer, method), {"n": 0}

    def wrapped(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, method, wrapped)
    return real


@pytest.fixture
def uninterrupted(tmp_path, corpus_dir, capsys):
    spec = _spec(tmp_path, corpus_dir)
    assert main(_argv(spec, tmp_path / "whole") + ["--registry", f"sqlite:///{tmp_path}/whole.db"]) == 0
    capsys.readouterr()
    return load_checkpoint(tmp_path / "whole")["model"]


@pytest.mark.parametrize("method, at_call, saved_step", [
    ("_forward_backward", 3, 2),  # in step 3's forward: step 3 never happened, its batches are drawn again
    ("_sync", 3, 3),              # inside step 3's optimizer update: deferred until the update is whole
])
def test_ctrl_c_saves_the_last_whole_step_and_the_printed_command_continues_it_exactly(
        tmp_path, corpus_dir, capsys, monkeypatch, uninterrupted, method, at_call, saved_step):
    spec = _spec(tmp_path, corpus_dir)
    real = _interrupt(monkeypatch, method, at_call)
    code = main(_argv(spec, tmp_path / "run"))  # checkpoint_interval 0: the default, no periodic checkpoints
    err = capsys.readouterr().err
    assert code == 130, err
    assert err.rstrip().endswith("interrupted")
    assert load_checkpoint(tmp_path / "run")["step"] == saved_step
    (line,) = [x for x in err.splitlines() if x.startswith("resume with: ")]
    command = shlex.split(line.removeprefix("resume with: "))
    for option in ("--no-compile", "--quiet", "--steps", "--device", "--set", "train.lr=1e-2"):
        assert option in command, (option, command)
    assert command[-2:] == ["--resume", str(tmp_path / "run" / "checkpoint.pt")]
    monkeypatch.setattr(Trainer, method, real)
    assert main(command[command.index("train"):] + ["--json"]) == 0  # after the program, however it was invoked
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "FINISHED" and result["step"] == 5
    resumed = load_checkpoint(tmp_path / "run")["model"]
    assert resumed.keys() == uninterrupted.keys()
    for name in resumed:  # the interrupted and resumed run is the uninterrupted run, bit for bit
        assert torch.equal(resumed[name], uninterrupted[name]), name


def test_an_interrupt_swallowed_during_setup_still_ends_the_run(tmp_path, corpus_dir, capsys, monkeypatch):
    """torch.compile's workers once swallowed Ctrl-C ('Exception ignored ... KeyboardInterrupt') and the run trained on
    to FINISHED; the interrupt is remembered and raised before the first step."""
    real = Trainer._build_model

    def swallowing(self):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass  # what a library's broad except does
        return real(self)

    monkeypatch.setattr(Trainer, "_build_model", swallowing)
    argv = [a for a in _argv(_spec(tmp_path, corpus_dir), tmp_path / "run") if a != "-q"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 130 and "FINISHED" not in err and "KILLED: interrupted at step 0" in err


def test_ctrl_c_pressed_again_during_the_last_save_still_saves_it(tmp_path, corpus_dir, capsys, monkeypatch):
    """Three Ctrl-C in a row once cut the stopping run's checkpoint short ("no checkpoint was saved"): once the run is
    stopping, more signals are held until its checkpoint and record are written."""
    _interrupt(monkeypatch, "_forward_backward", 3)
    real_save = Trainer.save

    def save_while_interrupted(self):
        os.kill(os.getpid(), signal.SIGINT)  # the second and third press, in the middle of the save
        os.kill(os.getpid(), signal.SIGINT)
        return real_save(self)

    monkeypatch.setattr(Trainer, "save", save_while_interrupted)
    code = main(_argv(_spec(tmp_path, corpus_dir), tmp_path / "run"))
    err = capsys.readouterr().err
    assert code == 130 and "resume with: " in err and "no checkpoint was saved" not in err, err
    assert load_checkpoint(tmp_path / "run")["step"] == 2
