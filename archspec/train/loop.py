"""The shared training loop: every generated model is trained by this one `Trainer`, which is what makes runs comparable.

    result = train(load_spec("specs/llama-like-tiny.yaml"), steps=50)
    result.status, result.metrics["val_loss"], result.losses

Setup (`Trainer.__init__`): world and device → precision (archspec.train.precision) → where the run starts
(archspec.train.checkpointer) → data → the generated model (seeded) → `parallelize` (archspec.train.parallelize:
TP/EP, activation checkpointing, compile, FSDP/replicate/DDP, pipeline, in that one order) → AdamW → resume.
One step (`train_step`): `grad_accum` batches through the layout's step (archspec.train.step: local or pipeline, one
interface) → clip → non-finite check → AdamW at `lr_at(step)` → the model's after-optimizer-step hook
(archspec.runtime.protocol). Around it (`run`): metrics every step, evaluation every `eval_interval` steps
(archspec.train.evaluation), checkpoints (archspec.train.checkpointer), heartbeats, final status
(archspec.train.report).
"""

from __future__ import annotations

import gc
import json
import math
import random
import signal
import time
from pathlib import Path

import torch

from archspec import codegen
from archspec.runtime.protocol import hooks_of
from archspec.signals import (Terminated, deferred_interrupts, install_signal_handlers, interrupts_held, last_words,
                              raise_if_terminated, stop_signals)
from archspec.spec import Spec
from archspec.train import report
from archspec.train.build import Build, prepare
from archspec.cache import cache_dir, digest
from archspec.train.checkpoint import CheckpointWriteError, load_weights_into, resolve, rng_state
from archspec.train.checkpointer import AlreadyFinished, Checkpointer, TrainingState, identify, read_start
from archspec.train.compile import requested_compile
from archspec.train.data import TrainData, build_data
from archspec.train.distributed import World, init_world, world_env
from archspec.train.evaluation import evaluate
from archspec.train.logger import FAILED, FINISHED, KILLED, NullLogger, RecordingError, RunInfo, RunLogger
from archspec.train.mesh import JobMesh, Layout
from archspec.train.metrics import RunMetrics, SpikeCounter, StabilityProbe, StepStats
from archspec.train.optim import build_optimizer, lr_at, set_lr
from archspec.train.parallelize import parallelize
from archspec.train.precision import Precision
from archspec.train.progress import ProgressBar, SweepPosition, eval_line
from archspec.train.result import NonFiniteLoss, TrainResult, with_steps  # noqa: F401
from archspec.train.step import split_batch, step_for, warm_up
from archspec.train.throughput import peak_flops, peak_memory_bytes, reset_peak_memory

HEARTBEAT_S = 10.0  # seconds between heartbeats (each one also flushes buffered metrics)


class Trainer:
    def __init__(self, spec: Spec, *, device: str = "auto", logger: RunLogger | None = None,
                 resume: str | Path | None = None, run_dir: str | Path | None = None, compile: bool | str | None = None,
                 progress: bool = False, cache: str | Path | None = None, world: World | None = None,
                 init_from: str | Path | None = None, build: Build | None = None):
        """build: this run's `archspec.train.build.prepare` when the caller made it already (the sweep runner,
        which checks every job's data, run id and memory before anything trains); else made here."""
        self.started = time.perf_counter()
        self.spec, self.recipe = spec, spec.train
        self.world = world or init_world(device)
        self.device = self.world.device
        # Where this process sits: which data it reads (dp), which shards of the model it holds (tp, ep, pp)
        self.layout = Layout.of(self.recipe.parallel, self.world.size)
        reset_peak_memory(self.device)
        self.precision = Precision.of(self.recipe, self.device, self.world)
        self.cache = cache_dir(cache)
        self.logger: RunLogger = (logger or NullLogger()) if self.world.is_main else NullLogger()
        self.load_samples: list[float] = []
        self.progress = ProgressBar(bool(progress) and self.world.is_main, total=self.recipe.steps,
                                    sweep=progress if isinstance(progress, SweepPosition) else None)
        self.start = read_start(spec, resume, init_from)  # the run's identity includes its starting weights
        self.step_start: tuple[dict, dict] | None = None  # (data position, RNG state) while a step is under way
        if build is None or build.world_size != self.world.size or build.recipe.get("init_from") != self.start.init_digest:
            build = prepare(spec, self._build_data(), world_size=self.world.size, init_digest=self.start.init_digest)
        self.build, self.data = build, build.data
        # target tokens in the validation set, over every process (each holds as many windows)
        self.eval_tokens = sum(len(b[0]) for b in self.data.val_batches) * self.layout.dp * self.recipe.seq_len
        self.experiment_id = build.experiment_id
        self.run_id, self.repeat, self.run_dir = identify(spec, build, self.start, self.logger, run_dir)
        self.generated, self.model = self._build_model()
        self.precision.convert(self.model, spec)
        self.compile_mode, self.compile_reason = self._should_compile(compile)
        mesh = JobMesh.build(self.device.type, self.layout) if not self.layout.trivial else None
        self.par = parallelize(self.model, self.build, mesh, world=self.world, precision=self.precision,
                               compile_mode=self.compile_mode, device=self.device)
        self.stepper, self.hooks = step_for(self.par, self.precision), hooks_of(self.model)
        self.optimizer = build_optimizer(self.model, self.recipe, self.device, spec.model)
        self.compile_s = warm_up(self.stepper, self.recipe, self.device) if self.par.compiled else 0.0
        self.checkpointer = Checkpointer(self.run_dir, self.world, self.build, sharded=self.par.sharded,
                                         init_digest=self.start.init_digest, flush=getattr(self.logger, "flush", None),
                                         warn=self.progress.log)
        self.step, self.saved_step = 0, -1
        if self.start.resume_path:
            self.step = self.saved_step = self.checkpointer.restore(
                self.start.resume_path, self.start.resume_state, self.training_state(), self.recipe)
            self.start.resume_state = None  # the weights are in the model now; the loaded copy is not kept
        self.metrics = RunMetrics.of(build, self.world.size, peak_flops(
            self.device, self.precision.amp_dtype or torch.float32, self.cache), self.started,
            data_parallel=self.layout.dp)
        self.tokens_per_step = build.view.tokens_per_step
        self.progress.plan(self.tokens_per_step, self.eval_tokens, self.recipe.eval_every)  # the ETA's evaluations
        self.last_eval: dict[str, float] = {}
        # train.stability: per-layer figures at each evaluation (archspec.train.metrics), None when not asked
        self.stability = StabilityProbe(self.model) if self.recipe.stability else None
        self.spikes = SpikeCounter()
        self.record_failed = False  # the logger could not write (RecordingError): the run stopped for that

    # ── setup ────────────────────────────────────────────────────────────────────────────────────────────────────

    def _build_data(self) -> TrainData:
        """Rank 0 tokenises into the cache first; the others wait, then read the same files. Every data-parallel
        replica reads its own slice of each global batch; the processes that split one replica's model read the
        same slice."""
        if not self.world.is_main:
            self.world.barrier()
        data = build_data(self.spec, self.cache, rank=self.layout.coordinates(self.world.rank)["dp"],
                          world=self.layout.dp)
        if self.world.is_main:
            self.world.barrier()
        return data

    def _build_model(self) -> tuple[codegen.Generated, torch.nn.Module]:
        """Generate the spec's module into the run directory (the exact source this run trains, beside its
        checkpoint) and build it on the device from the run's seed; every rank starts from the same weights."""
        self.build = self.build.checked(self.device.type)
        self.memory_plan = self.build.memory
        generated = codegen.generate(self.spec, out_dir=self.run_dir)
        torch.manual_seed(self.recipe.seed)
        random.seed(self.recipe.seed)
        with torch.device(self.device):
            model = generated.Model()
        if self.start.init_weights is not None:
            load_weights_into(self.start.init_weights["path"], self.start.init_weights, model)
        # Dropout draws from a stream of its own per rank (the init stream above is shared by every rank).
        torch.manual_seed(int(digest("dropout", self.recipe.seed, self.world.rank)[:15], 16))
        return generated, model

    def _should_compile(self, requested: bool | str | None) -> tuple[str, str]:
        """The compile mode of this run and why (archspec.train.compile.requested_compile)."""
        return requested_compile(requested, self.build, self.world, self.layout)

    # what other code reads of the parts (the precision, the parallelized model)
    scaler = property(lambda self: self.precision.scaler)
    amp_dtype = property(lambda self: self.precision.amp_dtype)
    skipped_steps = property(lambda self: self.precision.skipped_steps)
    fsdp = property(lambda self: self.par.fsdp)

    # ── one step ─────────────────────────────────────────────────────────────────────────────────────────────────

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def to_device(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """A batch's tensors on the device: (inputs, targets), and a media batch's media."""
        if self.device.type == "cpu":
            return batch
        return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in batch)

    def _forward_backward(self, accum: int, sync: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One batch of the step through the layout's step (archspec.train.step): a micro-batch, or under pipeline
        parallelism a replica batch through the schedule. Gradients synchronise only when `sync` (the last)."""
        inputs, targets, media = split_batch(self.to_device(self.data.sampler.next_batch()))
        return self.stepper.batch(inputs, targets, accum, sync, media=media)

    def train_step(self) -> StepStats:
        """One optimizer step over `grad_accum` batches. Raises NonFiniteLoss before applying a bad update."""
        t0 = time.perf_counter()
        # Where this step started: an interruption before its update is complete saves this position and RNG state, so
        # the resumed run draws the step's batches and dropout masks again, exactly as if it had never been cut.
        self.step_start = (self.data.sampler.state_dict(), rng_state())
        lr = lr_at(self.step, self.recipe)
        set_lr(self.optimizer, lr)
        accum = self.recipe.grad_accum
        loss_sum, aux_sums = torch.zeros((), device=self.device), {}
        for micro in range(accum):
            loss, aux = self._forward_backward(accum, sync=micro == accum - 1)
            loss_sum += loss
            for name, value in aux.items():
                aux_sums[name] = aux_sums.get(name, 0.0) + value
        loss_sum, aux_sums = self.stepper.reduce(loss_sum, aux_sums)
        probed = self.stability is not None and self.evaluates_at(self.step + 1)
        self.precision.unscale(self.optimizer)
        if probed:  # the step before an evaluation: per-layer gradient norms (before clipping) and the update's
            self.stability.before_update()
        grad_norm = self.stepper.clip(self.recipe.grad_clip)  # the same on every rank: DDP averaged the gradients
        # Losses averaged over ranks, so every rank agrees on stopping at a non-finite loss; one sync per step.
        losses = self.world.mean(torch.stack([loss_sum, *aux_sums.values()]) / accum)
        loss_value, *aux_values, grad_norm = torch.cat([losses, grad_norm.reshape(1).float()]).tolist()
        overflow = self.precision.overflowed(grad_norm)
        self._check_finite(loss_value + sum(aux_values), 0.0 if overflow else grad_norm)
        with deferred_interrupts():  # never half an update: a signal now is raised once the step is whole
            self.precision.optimizer_step(self.optimizer, overflow)
            if not overflow:
                if probed:
                    self.stability.after_update()
                self.hooks.after_optimizer_step(self.par.replica_sum(self.world))  # updates outside the gradient
            self.optimizer.zero_grad(set_to_none=True)
            self._sync()
            self.step += 1
            self.step_start = None
        return StepStats(loss_value, dict(zip(aux_sums, aux_values)), math.nan if overflow else grad_norm, lr,
                         time.perf_counter() - t0)

    def _check_finite(self, loss: float, grad_norm: float) -> None:
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"non-finite loss ({loss}) at step {self.step + 1}")
        if not math.isfinite(grad_norm):
            raise NonFiniteLoss(f"non-finite gradient norm ({grad_norm}) at step {self.step + 1}")

    def evaluate(self) -> dict[str, float]:
        """Mean validation loss and the evaluation's metrics (archspec.train.evaluation)."""
        return evaluate(self)

    def evaluates_at(self, step: int) -> bool:
        """Whether the run evaluates once `step` steps are done."""
        return step % self.recipe.eval_every == 0 or step == self.recipe.steps

    # ── checkpoints ──────────────────────────────────────────────────────────────────────────────────────────────

    @property
    def checkpoint_path(self) -> Path:
        return self.checkpointer.path

    def training_state(self) -> TrainingState:
        return TrainingState(self.model, self.optimizer, getattr(self, "step", 0), self.run_id, self.data,
                             self.precision, getattr(self, "step_start", None))

    def save(self) -> None:
        """The checkpoint of the run as it stands (archspec.train.checkpointer.Checkpointer.save)."""
        self.checkpointer.save(self.training_state())
        self.saved_step = self.step

    def _save_on_stop(self) -> str:
        return self.checkpointer.save_on_stop(self.save, self.saved_step == self.step, self.step)

    # ── the run ──────────────────────────────────────────────────────────────────────────────────────────────────

    def run(self) -> TrainResult:
        """Train to `train.steps` (from the resumed step). A non-finite loss ends the run FAILED with the last good
        checkpoint left in place; Ctrl-C ends it KILLED; any other exception ends it FAILED and propagates."""
        with last_words(self._forced_stop):
            return self._run()

    def _forced_stop(self, signum: int, notes: dict) -> None:
        """A stop the process could not make in time (archspec.signals' watchdog): the run's record ends KILLED,
        without the last save a clean stop makes; the latest checkpoint is left for the resume line."""
        checkpoint = self.checkpointer.latest()
        how = "interrupted" if signum == signal.SIGINT else f"terminated (received {signal.Signals(signum).name})"
        self.logger.end(KILLED, f"{how} at step {self.step}: {notes['why']}, stopped without a last save"
                        + (f"; latest checkpoint {checkpoint}" if checkpoint else ""))
        if checkpoint is not None:
            notes["checkpoint"] = checkpoint

    def _run(self) -> TrainResult:
        self.run_id = self.logger.start(self.run_info()) or self.run_id
        losses: list[float] = []
        evals: list[tuple[int, float]] = []
        try:
            self._train(losses, evals)
        except NonFiniteLoss as e:
            return self._finish(FAILED, str(e), losses, evals)
        except CheckpointWriteError as e:  # the disk refused: stop here, the previous checkpoint is intact
            return self._finish(FAILED, f"{e} (after step {self.step})", losses, evals)
        except RecordingError as e:
            # The registry cannot be written (disk full): training on would produce a run nobody can see, and the
            # final write would fail anyway. Stop now, keep the work in a checkpoint, and say both.
            self.record_failed = True
            return self._finish(FAILED, f"stopped at step {self.step}: {e}{self._save_on_stop()}", losses, evals)
        except KeyboardInterrupt as e:
            how = f"terminated ({e})" if isinstance(e, Terminated) and not e.is_interrupt else "interrupted"
            # Ctrl-C never loses progress: the state at the last whole step is saved (checkpoint_interval or not).
            # Under several processes a save is collective and the others may not have been told: not attempted.
            # More signals (Ctrl-C pressed again) must not cut the last checkpoint or the record short: held.
            with interrupts_held():
                saved = "" if self.world.distributed else self._save_on_stop()
                result = self._finish(KILLED, f"{how} at step {self.step}{saved}", losses, evals)
            e.checkpoint = result.checkpoint  # type: ignore[attr-defined]  # for the CLI's resume command
            raise
        except Exception as e:
            self._finish(FAILED, f"{type(e).__name__} at step {self.step + 1}: {e}", losses, evals)
            raise
        return self._finish(FINISHED, None, losses, evals)

    def _train(self, losses: list[float], evals: list[tuple[int, float]]) -> None:
        self.logger.log_artifact("model", str(self.generated.path))
        with self.progress:
            report.announce(self)
            last_beat = time.monotonic()
            while self.step < self.recipe.steps:
                raise_if_terminated()  # a SIGTERM whose exception something swallowed during setup or a step
                stats = self.train_step()
                losses.append(stats.loss)
                self._record_step(stats)
                if self.evaluates_at(self.step):
                    evals.append((self.step, self._record_eval()))
                if self.recipe.checkpoint_interval and self.step % self.recipe.checkpoint_interval == 0:
                    self.save()
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    self.logger.heartbeat()
                    last_beat = time.monotonic()
        if not evals:  # resumed at the end (nothing left to train): the summary still needs a val loss
            evals.append((self.step, self._record_eval()))
        if self.saved_step != self.step:
            self.save()

    def _record_step(self, stats: StepStats) -> None:
        self.spikes.add(stats.loss)
        metrics = {**self.metrics.step(stats), **self.precision.metrics()}
        self.logger.log_metrics(self.step, metrics)
        self.progress.update(self.step, stats.loss, self.metrics.live_rate())

    def _record_eval(self) -> float:
        report.sample_load(self.load_samples)
        began = time.monotonic()
        self.last_eval = self.evaluate()
        self.progress.evaluated(time.monotonic() - began)
        self.logger.log_metrics(self.step, self.last_eval)
        self.logger.heartbeat()
        self.progress.log(eval_line(self.step, self.recipe.steps, self.last_eval, self.metrics.since_eval(self.step)))
        return self.last_eval["val_loss"]

    def run_info(self) -> RunInfo:
        return report.run_info(self)

    def summary(self, losses: list[float]) -> dict[str, float]:
        return report.summary(self, losses, peak_memory_bytes(self.device))

    def _finish(self, status: str, error: str | None, losses: list[float], evals: list) -> TrainResult:
        metrics = self.summary(losses)
        checkpoint = self.checkpointer.latest()
        try:
            self.logger.set_summary(metrics)
            if checkpoint:
                self.logger.log_artifact("checkpoint", str(checkpoint))
            self.logger.end(status, error)
        except RecordingError as e:
            # The record is incomplete, so the run (trained and recorded) did not succeed, whatever the training did.
            what = error or f"{status.lower()} after {self.step} steps"
            status, error = FAILED, what if self.record_failed else f"{what}; the run's record is incomplete: {e}"
            try:
                self.logger.end(FAILED, error)
            except RecordingError:
                pass
        if error:
            self.progress.log(f"[red]{status}[/]: {report.shown(error)}" +
                              (f" (last good checkpoint: {report.shown(checkpoint)})" if checkpoint else ""))
        else:
            self.progress.log(report.closing_line(self, metrics))
        return TrainResult(self.run_id, status, error, self.step, metrics, losses, evals, self.run_dir, checkpoint)


def train(spec: Spec, *, steps: int | None = None, device: str = "auto", logger: RunLogger | None = None,
          resume: str | Path | None = None, run_dir: str | Path | None = None, compile: bool | None = None,
          json_out: bool = False, progress: bool = False, cache: str | Path | None = None,
          init_from: str | Path | None = None, build: Build | None = None) -> TrainResult:
    """Train `spec` once through the shared loop.

    steps: override train.steps (the schedule's length). device: auto | cpu | cuda. logger: where the run is
    recorded (default: nowhere but the returned result). resume: a checkpoint file or run directory to continue.
    run_dir: where the generated module and checkpoint go (default runs/<name>-<run id>, or the resumed run's).
    compile: per-block torch.compile (default: train.compile). json_out: print the final metrics as one JSON object
    on stdout (rank 0). progress: show the progress bar and run lines on stderr. cache: the derived-data cache
    (default: the per-user cache, archspec.paths). init_from: start from these weights (a weights checkpoint from
    `archspec import-hf`, or a training checkpoint) instead of the seeded init; part of the run's identity.
    build: the run's `archspec.train.build.prepare`, when the caller made it (the sweep runner).
    """
    if steps is not None:
        spec = with_steps(spec, steps)
    Layout.of(spec.train.parallel, world_env()[0])  # a layout the processes cannot make: refused before any group
    world = init_world(device)
    trainer, finished = None, False
    handlers = install_signal_handlers(stop_signals())  # remembered, and deferred inside an update
    try:
        trainer = Trainer(spec, device=device, logger=logger, resume=resume, run_dir=run_dir, compile=compile,
                          progress=progress, cache=cache, world=world, init_from=init_from,
                          build=build if steps is None else None)
        result = trainer.run()
        finished = True
    except AlreadyFinished as e:
        finished = True
        path = resolve(resume) if resume is not None else None
        result = TrainResult(e.run_id, FINISHED, None, e.step, {}, run_dir=path.parent if path else None,
                             checkpoint=path, nothing_to_do=True)
    finally:
        handlers.restore()
        if world.distributed:  # the model and optimizer hold the process group: release them before destroying it
            trainer = None
            gc.collect()
        world.close(synchronize=finished)
    if json_out and world.is_main:
        print(json.dumps(result.to_json(), sort_keys=True), flush=True)
    return result
