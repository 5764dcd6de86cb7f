"""A run's checkpoints, kept by one `Checkpointer`: what a run starts from (its resumed checkpoint, or other weights),
the save (whole, or DCP's sharded state when parameters are DTensors, so it loads across layouts), the resume, and
the save an interruption makes. The file format and its checks are archspec.train.checkpoint's.

    start = read_start(spec, resume=..., init_from=...)           # read and checked before anything is built
    ckpt = Checkpointer(run_dir, world, build, sharded=...)
    ckpt.save(state)                                               # a TrainingState: model, optimizer, step, data
    ckpt.restore(path, checkpoint, state)                          # into a built model and optimizer
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from rich.markup import escape

from archspec.errors import UserError, printable
from archspec.spec import Spec, canonical_dict
from archspec.train.checkpoint import (FILENAME, CheckpointWriteError, _flatten, check_same_spec, load_checkpoint,
                                       load_sharded, load_weights, resolve, restore_modules, rng_state,
                                       save_checkpoint, save_sharded, set_rng_state, sharded_directory,
                                       sharded_dirname, weights_digest)
from archspec.train.logger import FINISHED, repeat_id
from archspec.train.optim import restore_hyperparameters
from archspec.train.tokenizer import TOKENIZER_FILE, tokenizer_state


class AlreadyFinished(Exception):
    """`--resume` of a run the registry holds as FINISHED, from its final step: nothing to do, nothing written."""

    def __init__(self, run_id: str, step: int):
        super().__init__(f"run {run_id} already FINISHED; nothing to resume (its checkpoint is at its final step, "
                         f"{step})")
        self.run_id, self.step = run_id, step


def check_start(resume, init_from) -> None:
    """A run starts from a checkpoint (--resume) or from other weights (--init-from), never both."""
    if init_from is not None and resume is not None:
        raise UserError("--resume and --init-from: give one (a resumed run continues from its checkpoint's weights, "
                        "and its checkpoint remembers which weights it started from)")


@dataclass
class Start:
    """Where a run starts: a resumed checkpoint (read and checked once), or other weights, or the seeded init."""

    resume_path: Path | None = None
    resume_state: dict[str, Any] | None = None  # dropped once restored
    init_weights: dict[str, Any] | None = None
    init_digest: str | None = None  # the starting weights' digest: part of the run's identity


def read_start(spec: Spec, resume=None, init_from=None) -> Start:
    check_start(resume, init_from)
    if init_from is not None:
        weights = read_init(spec, init_from)
        return Start(init_weights=weights, init_digest=weights["digest"])
    if resume is None:
        return Start()
    path = resolve(resume)
    state = read_resume(spec, path)
    return Start(path, state, init_digest=resumed_init(path, state))


def read_init(spec: Spec, init_from) -> dict[str, Any]:
    """Weights to start from (a weights checkpoint from `import-hf`, or a training checkpoint): the model section
    of their spec must be this spec's; the recipe may differ (that is what fine-tuning is)."""
    path = resolve(init_from)
    weights = load_weights(path)
    saved, now = weights["spec"].get("model"), canonical_dict(spec)["model"]
    if saved != now:
        a, b = _flatten(saved if isinstance(saved, dict) else {}), _flatten(now)
        diffs = [f"model.{k}: weights {a.get(k)!r}, spec {b.get(k)!r}" for k in sorted(set(a) | set(b))
                 if a.get(k) != b.get(k)]
        raise UserError(f"{path}: these weights are for another architecture than {spec.name}'s",
                        diffs[:20] or ["(model sections differ)"])
    weights["path"] = path
    weights["digest"] = weights_digest(weights["model"])
    return weights


def read_resume(spec: Spec, path: Path) -> dict[str, Any]:
    """The checkpoint to resume, read and checked (digest, structure, finite values, same model and recipe, step
    within the run) once, before anything is built or recorded."""
    state = load_checkpoint(path)
    check_same_spec(path, state, canonical_dict(spec))
    if not 0 <= state["step"] <= spec.train.steps:
        raise UserError(f"{path}: checkpoint step {state['step']} is outside this run's 0..{spec.train.steps}")
    return state


def resumed_init(path: Path, state: dict[str, Any]) -> str | None:
    digest = state.get("init_from")
    if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                   and all(c in "0123456789abcdef" for c in digest)):
        raise UserError(f"{path}: init_from: expected the sha256 of the starting weights, got "
                        f"{printable(repr(digest), 80)}")
    return digest


def resumed_run_id(state: dict[str, Any], experiment_id: str, logger, steps: int) -> tuple[str, int]:
    """(run id, repeat) a checkpoint continues: the run that wrote it (its `run_id`, when it is this experiment or one
    of its repeats), else the experiment's run. A run the registry holds as FINISHED is never reopened: resumed from
    its final step there is nothing to do (AlreadyFinished); from an earlier step, the training continues as a new
    repeat of the experiment."""
    saved = state.get("run_id")
    known = {experiment_id, *(repeat_id(experiment_id, n) for n in range(1, 1001))}
    run_id = saved if isinstance(saved, str) and saved in known else experiment_id
    recorded = getattr(logger, "recorded_status", None)
    if not callable(recorded) or recorded(run_id) != FINISHED:
        return run_id, 0
    if state["step"] >= steps:
        raise AlreadyFinished(run_id, state["step"])
    repeat_for = getattr(logger, "repeat_for", None)
    n = repeat_for(experiment_id) if callable(repeat_for) else 0
    if not n:  # a logger that does not train finished experiments again: the sweep's rule (skip) applies
        raise AlreadyFinished(run_id, state["step"])
    return repeat_id(experiment_id, n), n


@dataclass
class TrainingState:
    """What a checkpoint holds of a run in progress (the Trainer's parts, by reference)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    step: int
    run_id: str
    data: Any  # TrainData: its sampler's position, its tokenizer
    precision: Any  # archspec.train.precision.Precision: the loss scaler's state
    step_start: tuple[dict, dict] | None = None  # (data position, RNG state) while a step is under way


class Checkpointer:
    def __init__(self, run_dir: Path, world, build, *, sharded: bool, init_digest: str | None,
                 flush: Callable[[], None] | None = None, warn: Callable[[str], None] = print):
        self.run_dir, self.world, self.build = run_dir, world, build
        self.sharded = sharded  # parameters held as DTensors (FSDP, or any split of the model): DCP's sharded state
        self.init_digest = init_digest
        self.flush, self.warn = flush, warn

    @property
    def path(self) -> Path:
        return self.run_dir / FILENAME

    def latest(self) -> Path | None:
        return self.path if self.path.exists() else None

    def save(self, state: TrainingState) -> None:
        """Rank 0 writes model, optimizer, step, data position and every rank's RNG state; the others wait. Saved
        between steps, or (interrupted) inside one whose update never happened: then the data position and RNG state
        are those the step started from."""
        mid_step = state.step_start
        rngs = [mid_step[1] if mid_step else rng_state()]
        if self.world.distributed:
            rngs = [None] * self.world.size
            torch.distributed.all_gather_object(rngs, rng_state())
        modules = self._save_shards(state) if self.sharded else {}
        if self.world.is_main:
            self._flush_metrics(state.step)
            save_checkpoint(self.path, self._state(state, rngs, modules, mid_step))
            for old in self.run_dir.glob("checkpoint-step*.dcp"):  # superseded sharded states of this run
                if old.name != modules.get("sharded"):
                    shutil.rmtree(old, ignore_errors=True)
            self._save_tokenizer(state.data.tokenizer)
        self.world.barrier()

    def _save_shards(self, state: TrainingState) -> dict[str, Any]:
        """Every rank writes its shards; checkpoint.pt (rank 0) commits them."""
        directory = self.run_dir / sharded_dirname(state.step)
        if self.world.is_main and directory.exists():
            shutil.rmtree(directory)  # a partial write of this step by an earlier, interrupted attempt
        self.world.barrier()
        return {"model": {}, "optimizer": {"state": {}, "param_groups": []},
                **save_sharded(directory, state.model, state.optimizer)}

    def _flush_metrics(self, step: int) -> None:
        """Every metric up to this step reaches the registry before a checkpoint claims the step: a process killed
        after the save (kill -9) and resumed from it then misses nothing (the resumed attempt keeps steps <= this)."""
        if callable(self.flush):
            try:
                self.flush()
            except Exception as e:  # a busy registry must not stop training; the points stay buffered
                self.warn(f"[yellow]metrics not yet flushed at step {step}: {escape(printable(str(e)))}[/]")

    def _state(self, state: TrainingState, rngs: list, modules: dict[str, Any], mid_step) -> dict[str, Any]:
        scaler = state.precision.state_dict()
        return {
            "spec_hash": self.build.model_hash, "spec": canonical_dict(self.build.spec), "step": state.step,
            "run_id": state.run_id,
            **({} if self.sharded else {"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()}),
            "rng": rngs, "data": mid_step[0] if mid_step else state.data.sampler.state_dict(),
            "world_size": self.world.size, **({"init_from": self.init_digest} if self.init_digest else {}),
            **{k: v for k, v in modules.items() if v is not None},
            "tokenizer": tokenizer_state(state.data.tokenizer),
            **({"grad_scaler": scaler} if scaler is not None else {}),
        }

    def _save_tokenizer(self, tokenizer) -> None:
        if tokenizer.saves_file:  # also as a plain tokenizer.json beside it, for other tools
            try:
                tokenizer.save(self.run_dir / TOKENIZER_FILE)
            except OSError as e:
                raise CheckpointWriteError(f"cannot write {self.run_dir / TOKENIZER_FILE}: {e}") from None

    def restore(self, path: Path, checkpoint: dict[str, Any], state: TrainingState, recipe) -> int:
        """Load a checkpoint (read by `read_resume`) into the built model, optimizer, sampler, loss scaler and RNG;
        returns its step. DCP's sharded state loads whatever the world size, one process included."""
        sharded = sharded_directory(path, checkpoint)
        if sharded is not None:
            load_sharded(path, sharded, state.model, state.optimizer)
            restore_hyperparameters(state.optimizer, state.model, recipe)
        elif self.sharded:
            raise UserError(f"{path}: a whole (non-sharded) checkpoint cannot seed a sharded run (FSDP, tp or ep) yet; "
                            "resume it on one process or under DDP without tp/ep, whose checkpoints sharded runs do not "
                            "read")
        else:
            restore_modules(path, checkpoint, state.model, state.optimizer)
        state.data.sampler.load_state_dict(checkpoint["data"])
        try:
            state.precision.load_state_dict(checkpoint.get("grad_scaler"))
        except ValueError as e:
            raise UserError(f"{path}: grad_scaler: not a loss scaler's state ({e})") from None
        per_rank = checkpoint["rng"]
        set_rng_state(per_rank[self.world.rank] if len(per_rank) == self.world.size else per_rank[0])
        return int(checkpoint["step"])

    def save_on_stop(self, save: Callable[[], None], saved: bool, step: int) -> str:
        """The save an interruption (or a registry that stopped recording) makes; its part of the stop message."""
        if saved:
            return ""
        try:
            save()
            return f"; checkpoint saved at step {step}"
        except CheckpointWriteError as e:
            return f"; {e}"


def identify(spec: Spec, build, start: Start, logger, run_dir) -> tuple[str, int, Path]:
    """(run id, repeat, run directory). A fresh run of an experiment that already FINISHED gets an id (and run
    directory) of its own when the logger asks for it (`archspec train`): the finished run, its metrics, summary and
    checkpoint stay whole. A resumed run continues the run its checkpoint names (`resumed_run_id`)."""
    experiment_id, resume_path = build.experiment_id, start.resume_path
    repeat_for = getattr(logger, "repeat_for", None)
    repeat = repeat_for(experiment_id) if repeat_for and not resume_path else 0
    run_id = repeat_id(experiment_id, repeat) if repeat else experiment_id
    if start.resume_state is not None:
        run_id, resumed = resumed_run_id(start.resume_state, experiment_id, logger, spec.train.steps)
        repeat = resumed or repeat
    from archspec.train.run_dir import default_run_dir

    directory = Path(run_dir) if run_dir else (resume_path.parent if resume_path else default_run_dir(spec.name, run_id))
    if run_id != experiment_id and not resume_path and (directory / FILENAME).exists():
        raise UserError(f"{directory}: holds a checkpoint (of run {experiment_id}, which FINISHED, or of another run); "
                        f"this repeat, run {run_id}, needs a directory of its own: pass another --run-dir, or none for "
                        "runs/<name>-<run id>")
    return run_id, repeat, directory
