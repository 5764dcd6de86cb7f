"""Faults at the training boundary (issue 12): malformed and corrupted checkpoints, a disk that refuses the save,
SIGTERM (exit 143, never lost), kill -9 then resume, and a sweep whose later variant cannot fit in memory.

Every fault must end the run with a true status and leave nothing half-written."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from archspec.ablate.runner import run_jobs
from archspec.ablate.sweep import load_sweep
from archspec.errors import UserError
from archspec.signals import Terminated, install_signal_handlers, raise_if_terminated
from archspec.train import checkpoint as ckpt
from archspec.train.checkpoint import load_checkpoint, save_checkpoint
from archspec.train.logger import FAILED, FINISHED, KILLED, NullLogger
from archspec.train.loop import Trainer, train

from .conftest import tiny_spec_dict

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory, corpus_dir, cache) -> Path:
    from archspec.spec import load_spec_dict

    run_dir = tmp_path_factory.mktemp("good")
    train(load_spec_dict(tiny_spec_dict(corpus_dir, steps=2, warmup_steps=1)), run_dir=run_dir, cache=cache)
    return run_dir / ckpt.FILENAME


def _raw(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


# ── malformed fields: each refused by name, before any of it is used ────────────────────────────────────────────

def _python_rng_short(s):
    s["rng"][0]["python"] = (3, tuple(range(10)), None)


def _torch_rng_short(s):
    s["rng"][0]["torch"] = torch.zeros(16, dtype=torch.uint8)


def _drop_cursor(s):
    del s["data"]["cursor"]


BROKEN = {
    "step-text": (lambda s: s.update(step="abc"), "step: expected a non-negative integer, got str 'abc'"),
    "step-none": (lambda s: s.update(step=None), "step: expected a non-negative integer, got NoneType None"),
    "step-negative": (lambda s: s.update(step=-3), "step: expected a non-negative integer"),
    "step-bool": (lambda s: s.update(step=True), "step: expected a non-negative integer"),
    "rng-empty": (lambda s: s.update(rng=[]), "rng: expected a non-empty list"),
    "rng-text": (lambda s: s.update(rng=["x"]), "rng[0]: expected a mapping of RNG states"),
    "python-rng-size": (_python_rng_short, "rng[0].python: not a Python RNG state"),
    "torch-rng-size": (_torch_rng_short, "rng[0].torch: expected a uint8 tensor of shape"),
    "data-list": (lambda s: s.update(data=[]), "data: expected a mapping"),
    "data-no-cursor": (_drop_cursor, "data.cursor: missing"),
    "cursor-text": (lambda s: s["data"].update(cursor="0"), "data.cursor: expected a non-negative integer, got str '0'"),
    "model-list": (lambda s: s.update(model=[1]), "model: expected a mapping of parameter names to tensors"),
    "optimizer-empty": (lambda s: s.update(optimizer={}), "optimizer: expected an optimizer state_dict"),
    "world-size": (lambda s: s.update(world_size="2"), "world_size: expected a positive integer"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_checkpoint_with_a_wrong_field_is_refused_by_field(case, good_checkpoint, tmp_path):
    edit, needle = BROKEN[case]
    state = _raw(good_checkpoint)
    state.pop("format"), state.pop("digest")
    edit(state)
    path = tmp_path / ckpt.FILENAME
    save_checkpoint(path, state)  # a consistent digest: the structure check is what must refuse it
    with pytest.raises(UserError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"{path}: malformed checkpoint")
    assert any(needle in p for p in info.value.problems), info.value.problems


def test_resume_from_a_malformed_checkpoint_exits_2_naming_the_field(good_checkpoint, make_spec, corpus_dir,
                                                                       tmp_path, capsys):
    from archspec.cli import main

    state = _raw(good_checkpoint)
    state.pop("format"), state.pop("digest")
    state["data"]["cursor"] = "0"
    run_dir = tmp_path / "run"
    save_checkpoint(run_dir / ckpt.FILENAME, state)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(tiny_spec_dict(corpus_dir, steps=2, warmup_steps=1)))
    rc = main(["train", str(spec), "--resume", str(run_dir), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "data.cursor: expected a non-negative integer" in err, err


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_special_file_as_checkpoint_is_refused_without_reading_it(special, tmp_path):
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "checkpoint.pt"
        os.mkfifo(path)
    with pytest.raises(UserError, match="not a regular file"):
        load_checkpoint(path)


# ── integrity: a digest stored at save time, checked at load time ───────────────────────────────────────────────


def test_flipped_bytes_in_a_checkpoint_are_refused(good_checkpoint, tmp_path):
    data = bytearray(good_checkpoint.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 4096] = bytes(b ^ 0xFF for b in data[middle: middle + 4096])
    path = tmp_path / ckpt.FILENAME
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="checkpoint is corrupted|not a readable checkpoint"):
        load_checkpoint(path)


@pytest.mark.parametrize("where", ["model", "optimizer", "step"])
def test_changed_content_that_still_unpickles_fails_the_digest(where, good_checkpoint, tmp_path):
    state = _raw(good_checkpoint)  # carries the digest of the original content
    if where == "model":
        next(iter(state["model"].values())).view(-1)[0] += 1.0
    elif where == "optimizer":
        first = next(iter(state["optimizer"]["state"].values()))
        first["exp_avg"].view(-1)[3] *= -1
    else:
        state["step"] += 1
    path = tmp_path / ckpt.FILENAME
    torch.save(state, path)
    with pytest.raises(UserError, match="checkpoint is corrupted: its content does not match the digest"):
        load_checkpoint(path)
    state = _raw(good_checkpoint)
    torch.save(state, path)
    assert load_checkpoint(path)["step"] == 2  # the untouched content passes


def test_a_current_checkpoint_relabelled_as_the_first_format_is_refused(good_checkpoint, tmp_path):
    """Deleting the digest and claiming the old format does not skip verification: the structure is not what the
    first format wrote (tests/train/test_untrusted_files.py has the exact old structure, which loads with a warning)."""
    state = _raw(good_checkpoint)
    state.pop("digest")
    state["format"] = ckpt.LEGACY_FORMATS[0]
    path = tmp_path / ckpt.FILENAME
    torch.save(state, path)
    with pytest.raises(UserError, match="not what that version wrote"):
        load_checkpoint(path)


# ── a disk that refuses the save ─────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 6336 vs 6224"),
], ids=["enospc", "torch-unexpected-pos"])
def test_a_failed_final_save_ends_the_run_failed_naming_the_disk(failure, make_spec, tmp_path, cache, monkeypatch):
    real_save = torch.save
    calls = {"n": 0}

    def save_then_fail(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_save(obj, f, *args, **kwargs)  # the step-2 checkpoint is written
        f.write(b"PK\x03\x04 a torn half")
        raise failure

    monkeypatch.setattr(ckpt.torch, "save", save_then_fail)
    run_dir = tmp_path / "run"
    logger = NullLogger()
    result = train(make_spec(steps=4, checkpoint_interval=2, warmup_steps=1), run_dir=run_dir, cache=cache,
                   logger=logger)
    assert result.status == FAILED == logger.status and result.step == 4
    assert result.error.startswith(f"cannot write checkpoint {run_dir / ckpt.FILENAME}: ")
    assert "MiB free on the disk holding" in result.error and result.error.endswith("(after step 4)")
    if isinstance(failure, OSError):
        assert "no space left on the device" in result.error
    monkeypatch.undo()
    assert load_checkpoint(run_dir)["step"] == 2  # the previous checkpoint, whole
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]  # no temporary left behind
    assert logger.summary["steps"] == 4 and "val_loss" in logger.summary


# ── the registry's disk fills up mid-run ─────────────────────────────────────────────────────────────────────────


def _fill_registry_at(registry, step: int):
    """A forward pre-hook that, at training step `step`, caps the SQLite database at its current size (PRAGMA
    max_page_count on every new connection): from then on, writes that need a page fail with SQLITE_FULL, "database or
    disk is full", exactly as on a full disk."""
    from sqlalchemy import event

    seen = {"n": 0}

    def hook(module, args):
        if not module.training:
            return
        seen["n"] += 1
        if seen["n"] == step:
            with registry.engine.connect() as conn:
                pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
            event.listen(registry.engine, "connect", lambda dbapi, _: dbapi.execute(f"PRAGMA max_page_count = {pages}"))
            registry.engine.dispose()

    return hook


def test_a_full_registry_disk_mid_run_stops_the_run_failed_with_a_checkpoint(make_spec, tmp_path, cache, monkeypatch):
    """Decision (README): the run stops at the first write the registry refuses, saves a checkpoint, and ends FAILED
    saying so; it does not train on unrecorded. A real SQLITE_FULL (the database capped at its size at step 3)."""
    from archspec.registry import Registry, RegistryLogger

    url = f"sqlite:///{tmp_path}/registry.db"
    steps = 40  # the free space left in the last pages takes a dozen steps to fill
    logger = RegistryLogger(url, background=False, flush_every=8, flush_interval_s=3600)
    real_build = Trainer._build_model

    def build_with_hook(self):
        generated, model = real_build(self)
        model.register_forward_pre_hook(_fill_registry_at(logger.registry, 3))
        return generated, model

    monkeypatch.setattr(Trainer, "_build_model", build_with_hook)
    run_dir = tmp_path / "run"
    result = train(make_spec(steps=steps, eval_interval=10, warmup_steps=1), run_dir=run_dir, cache=cache,
                   logger=logger)
    assert result.status == FAILED and "database or disk is full" in result.error
    assert result.step < steps and result.error.startswith(f"stopped at step {result.step}: registry ")
    assert f"checkpoint saved at step {result.step}" in result.error
    assert load_checkpoint(run_dir)["step"] == result.step  # the work is kept: `--resume` continues from here
    # The status row is updated in place, which a full database still allows: FAILED, never RUNNING or FINISHED.
    assert Registry(url).run_status(result.run_id) == FAILED


def test_a_registry_that_refuses_only_the_final_write_never_records_finished(make_spec, tmp_path, cache, monkeypatch):
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from archspec.registry import Registry, RegistryLogger

    url = f"sqlite:///{tmp_path}/registry.db"
    logger = RegistryLogger(url, background=False, flush_every=10**6, flush_interval_s=3600)

    def full(*args, **kwargs):
        raise OperationalError("INSERT INTO metrics ...", {}, sqlite3.OperationalError("database or disk is full"))

    monkeypatch.setattr(logger.registry, "write_metrics", full)  # every point waits for the final flush, which fails
    result = train(make_spec(steps=4, eval_interval=2, warmup_steps=1), run_dir=tmp_path / "run", cache=cache,
                   logger=logger)
    assert result.status == FAILED and result.step == 4
    assert "the run's record is incomplete" in result.error and "database or disk is full" in result.error
    run = Registry(url).get_run(result.run_id)
    assert run.status == FAILED and "the registry refused the final write" in run.error


# ── SIGTERM ──────────────────────────────────────────────────────────────────────────────────────────────────────


def test_a_swallowed_sigterm_is_not_lost():
    with install_signal_handlers():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Terminated:
            pass  # a library's broad except
        with pytest.raises(Terminated) as info:
            raise_if_terminated()
        assert info.value.exit_code == 143
    raise_if_terminated()  # restored handlers forget it: nothing pending afterwards


def test_a_sigterm_swallowed_during_setup_still_stops_the_loop_before_its_first_step(make_spec, tmp_path, cache,
                                                                                      monkeypatch):
    real_compile = Trainer._should_compile

    def setup_that_swallows(self, requested):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            pass
        return real_compile(self, requested)

    monkeypatch.setattr(Trainer, "_should_compile", setup_that_swallows)
    logger = NullLogger()
    with install_signal_handlers():
        with pytest.raises(Terminated):
            train(make_spec(steps=50), run_dir=tmp_path / "run", cache=cache, logger=logger)
    assert logger.status == KILLED and logger.summary["steps"] == 0


def _cli_env(cache: Path, registry: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(ARCHSPEC_CACHE=str(cache), ARCHSPEC_REGISTRY=registry, PYTHONPATH=str(ROOT))
    return env


def test_sigterm_during_training_exits_143_and_records_killed(corpus_dir, cache, tmp_path):
    from archspec.registry import Registry

    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(tiny_spec_dict(corpus_dir, steps=100_000, eval_interval=100_000)))
    url = f"sqlite:///{tmp_path}/registry.db"
    proc = subprocess.Popen([sys.executable, "-m", "archspec", "train", str(spec), "--run-dir",
                             str(tmp_path / "run")], cwd=tmp_path, env=_cli_env(cache, url), stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # wait until the run has started (its first line names it)
            if line.startswith("run "):
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err and "terminated (received SIGTERM)" in err
    (run,) = Registry(url).runs()
    assert run.status == KILLED and "SIGTERM" in (run.error or "")


# ── kill -9, then resume: nothing the checkpoint covers is missing from the registry ────────────────────────────

_KILLED_AFTER_SAVE = """
import json, os, signal, sys
from archspec.registry import RegistryLogger
from archspec.spec import load_spec_dict
from archspec.train.loop import Trainer, train

real_save = Trainer.save
def save_then_die(self):
    real_save(self)
    if self.step == 4:
        os.kill(os.getpid(), signal.SIGKILL)  # after the checkpoint, before the background flush (60 s away)
Trainer.save = save_then_die
spec = load_spec_dict(json.loads(sys.argv[1]))
logger = RegistryLogger(sys.argv[2], heartbeat_timeout_s=3600.0, flush_interval_s=60.0, flush_every=10**6)
train(spec, run_dir=sys.argv[3], cache=sys.argv[4], logger=logger)
"""


def test_kill_9_then_resume_at_once_keeps_the_val_loss_of_the_checkpoint_step(corpus_dir, cache, tmp_path):
    """The killed writer's heartbeat is still fresh (timeout 1 h), yet the run reads as stale at once and the resume
    is allowed at once: it was written on this host by a pid that no longer exists."""
    from archspec.registry import Registry, RegistryLogger
    from archspec.spec import load_spec_dict

    data = tiny_spec_dict(corpus_dir, steps=6, eval_interval=2, checkpoint_interval=2, warmup_steps=1)
    url, run_dir = f"sqlite:///{tmp_path}/registry.db", tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _KILLED_AFTER_SAVE, json.dumps(data), url, str(run_dir), str(cache)],
                          cwd=tmp_path, env=_cli_env(cache, url), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert load_checkpoint(run_dir)["step"] == 4
    registry = Registry(url)
    (dead,) = registry.runs()
    assert dead.status == "RUNNING" and dead.stale and int(dead.tags["pid"]) != os.getpid()
    result = train(load_spec_dict(data), run_dir=run_dir, resume=run_dir, cache=cache, logger=RegistryLogger(url))
    assert result.status == FINISHED and registry.get_run(result.run_id).attempt == 2
    assert [p.step for p in registry.metric_history(result.run_id, "val_loss")] == [2, 4, 6]
    assert [p.step for p in registry.metric_history(result.run_id, "train_loss")] == [1, 2, 3, 4, 5, 6]


# ── a sweep whose later variant cannot fit refuses before training anything ────────────────────────────────────


def test_a_sweep_checks_every_variants_memory_before_training(corpus_dir, cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = tiny_spec_dict(corpus_dir, steps=2, warmup_steps=1)
    # v1: 64 layers of d_model 32768, about 2 TB of weights and AdamW state: no machine holds it
    sweep = load_sweep(data={"name": "mem", "base": base,
                             "zip": {"model.d_model": [32, 32768], "model.attention.n_heads": [2, 64],
                                     "model.n_layers": [1, 64]}})
    started = []

    def factory():
        logger = NullLogger()
        started.append(logger)
        return logger

    with pytest.raises(UserError) as info:
        run_jobs(sweep, sweep.jobs, f"sqlite:///{tmp_path}/r.db", device="cpu", cache=cache, logger_factory=factory)
    assert "cannot fit in memory; nothing was trained" in str(info.value)
    assert [p.split(" ")[1] for p in info.value.problems] == ["1"]  # the later variant, by index
    assert started == []  # not even the variants that fit were trained


# ── a batch far too large for memory is refused before the run is recorded ─────────────────────────────────────


def test_a_batch_that_cannot_fit_is_refused_before_anything_is_recorded(corpus_dir, tmp_path, capsys):
    from archspec.cli import main

    db = tmp_path / "registry.db"
    rc = main(["train", str(ROOT / "specs" / "llama-like-tiny.yaml"), "--set", "train.batch_size=65536",
               "--set", f"train.data.corpus={{kind: files, paths: [{json.dumps(str(corpus_dir))}]}}",
               "--no-compile", "-q", "--registry", f"sqlite:///{db}", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "needs about" in err and "activations" in err, err
    assert not db.exists()  # no run was recorded (not even FAILED): nothing was allocated or started
