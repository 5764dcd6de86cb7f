"""The shared training loop: every generated model is trained by this one `Trainer`, which is what makes runs comparable.

    result = train(load_spec("specs/llama-like-tiny.yaml"), steps=50)
    result.status, result.metrics["val_loss"], result.losses

Setup (`Trainer.__init__`): world and device → data → the generated model (seeded) → compile (train.compile, as
archspec.train.compile resolves it) → AdamW → DDP → resume. One step (`train_step`): `grad_accum` micro-batches →
clip → non-finite check → AdamW at `lr_at(step)` (a model with `after_micro_batch()` / `after_optimizer_step(all_sum)`
has them called after each training forward and after the update: state it keeps outside the gradient, summed over
micro-batches and ranks).
Around it (`run`): metrics every step, evaluation every `eval_interval` steps (default: ten a run), checkpoints,
heartbeats, final status.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import resource
import shutil
import socket
import signal
import subprocess
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.markup import escape
from torch import nn

import archspec
from archspec import codegen
from archspec.errors import UserError, printable
from archspec.registry.values import writer_identity
from archspec.spec import Spec, canonical_dict, load_spec_dict
from archspec.train.cache import cache_dir, digest
from archspec.signals import (Terminated, deferred_interrupts, install_signal_handlers, interrupts_held, last_words,
                              raise_if_terminated, stop_signals)
from archspec.train.checkpoint import (
    load_sharded,
    save_sharded,
    sharded_directory,
    sharded_dirname,
    FILENAME,
    CheckpointWriteError,
    check_same_spec,
    load_checkpoint,
    load_weights,
    load_weights_into,
    weights_digest,
    resolve,
    restore_modules,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from archspec.train.build import Build, prepare
from archspec.train.compile import compile_whole, resolve_compile
from archspec.train.metrics import (STABILITY_PREFIX, KindStats, RunMetrics, SpikeCounter, StabilityProbe, StepStats,
                                    average_rate_label)
from archspec.train.data import TrainData, build_data
from archspec.train.distributed import World, init_world, no_sync, world_env, wrap_ddp
from archspec.train.logger import (
    FAILED,
    FINISHED,
    KILLED,
    NullLogger,
    RecordingError,
    RunInfo,
    RunLogger,
    repeat_id,
)
from archspec.train.mesh import JobMesh, Layout
from archspec.train.pipeline import held_blocks
from archspec.train.parallel import (apply_activation_checkpointing, clip_gradients, full_value, shard_data_parallel,
                                     shard_fsdp, split_model)
from archspec.quant.precision import check_precision, convert_fp8, loss_scaler
from archspec.train.optim import build_optimizer, lr_at, restore_hyperparameters, set_lr
from archspec.train.progress import ProgressBar, SweepPosition, eval_line
from archspec.train.run_dir import default_run_dir
from archspec.train.throughput import peak_flops
from archspec.train.tokenizer import TOKENIZER_FILE, tokenizer_state

def _shown(value: Any) -> str:
    """Text from the spec or the file system on a progress line: control characters escaped, rich markup inert."""
    return escape(printable(str(value)))


HEARTBEAT_S = 10.0  # seconds between heartbeats (each one also flushes buffered metrics)


class AlreadyFinished(Exception):
    """`--resume` of a run the registry holds as FINISHED, from its final step: nothing to do, nothing written."""

    def __init__(self, run_id: str, step: int):
        super().__init__(f"run {run_id} already FINISHED; nothing to resume (its checkpoint is at its final step, "
                         f"{step})")
        self.run_id, self.step = run_id, step


class NonFiniteLoss(Exception):
    """A step produced a NaN/inf loss or gradient norm; the update was not applied."""


@dataclass
class TrainResult:
    run_id: str
    status: str  # FINISHED | FAILED (KILLED and crashes propagate as exceptions)
    error: str | None
    step: int  # optimizer steps completed, counting those before a resume
    metrics: dict[str, float]  # the summary sent to the logger
    losses: list[float] = field(default_factory=list)  # train loss of every step this call ran
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, val_loss)
    run_dir: Path | None = None
    checkpoint: Path | None = None
    nothing_to_do: bool = False  # --resume of a FINISHED run at its final step: not trained, nothing recorded

    def to_json(self) -> dict[str, Any]:
        out = {"run_id": self.run_id, "status": self.status, "error": self.error, "step": self.step,
               **self.metrics, "run_dir": str(self.run_dir), "checkpoint": str(self.checkpoint) if self.checkpoint else None}
        if self.nothing_to_do:
            out["nothing_to_do"] = True
        return out


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """None: plain fp32. `auto` is bf16 autocast on a CUDA device that has bf16, fp32 elsewhere (CPUs without native
    bf16 run it hundreds of times slower)."""
    if precision == "fp32":
        return None
    if precision in ("bf16", "fp8"):  # fp8: the float8 linears (archspec.quant.precision) inside bf16 autocast
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None


def check_start(resume, init_from) -> None:
    """A run starts from a checkpoint (--resume) or from other weights (--init-from), never both."""
    if init_from is not None and resume is not None:
        raise UserError("--resume and --init-from: give one (a resumed run continues from its checkpoint's weights, "
                        "and its checkpoint remembers which weights it started from)")


def with_steps(spec: Spec, steps: int) -> Spec:
    """The spec with train.steps replaced, validated again. A warmup longer than the shortened run is cut to the
    run's length (a 5-step smoke test of a preset with 10 warmup steps should just run)."""
    overrides = [f"train.steps={int(steps)}"]
    if spec.train.warmup_steps > steps:
        overrides.append(f"train.warmup_steps={int(steps)}")
    return load_spec_dict(canonical_dict(spec), overrides, origin=f"{spec.name} (--steps {steps})")


def code_version() -> str:
    version = archspec.__version__
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True,
                             text=True, timeout=5, cwd=Path(archspec.__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{version}+g{rev}" if rev else version


def reset_peak_memory(device: torch.device) -> None:
    """Start this run's peak-memory window: a sweep trains many runs in one process, and each reports its own peak.
    CUDA: the allocator's peak stats. Linux: writing 5 to /proc/self/clear_refs resets VmHWM (peak RSS) to the
    current RSS. Elsewhere the process-lifetime peak is all there is (`peak_memory_bytes` then over-reports)."""
    if device.type == "cuda":
        torch.cuda.init()  # the allocator's stats refuse a device ("Invalid device argument") before CUDA starts
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory_bytes(device: torch.device) -> int:
    """Peak since `reset_peak_memory`: CUDA allocated bytes, or the process's peak RSS (VmHWM) on Linux."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB: the process's peak RSS


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
        # Where this process sits: which data it reads (dp), which shards of the model it holds (tp, ep)
        self.layout = Layout.of(self.recipe.parallel, self.world.size)
        self.coords = self.layout.coordinates(self.world.rank)
        reset_peak_memory(self.device)
        check_precision(self.recipe.precision, self.device, self.recipe.parallel.kind, self.world.distributed)
        self.amp_dtype = autocast_dtype(self.recipe.precision, self.device)
        self.scaler = loss_scaler(self.recipe.precision, self.device)  # fp16: dynamic loss scaling
        self.skipped_steps = 0  # fp16: steps whose gradients overflowed, skipped
        self.amp_dtype_autocast = self.amp_dtype
        self.cache = cache_dir(cache)
        self.logger: RunLogger = (logger or NullLogger()) if self.world.is_main else NullLogger()
        self.load_samples: list[float] = []
        self.progress = ProgressBar(bool(progress) and self.world.is_main, total=self.recipe.steps,
                                    sweep=progress if isinstance(progress, SweepPosition) else None)

        check_start(resume, init_from)
        self.init_weights = self._read_init(init_from) if init_from is not None else None
        self.resume_path = resolve(resume) if resume is not None else None
        self.resume_state = self._read_resume(self.resume_path) if self.resume_path else None
        # The starting weights are part of the run's identity; a resumed run takes them from its checkpoint.
        self.init_digest = self.init_weights["digest"] if self.init_weights else self._resumed_init()
        self.step_start: tuple[dict, dict] | None = None  # (data position, RNG state) while a step is under way
        if build is None or build.world_size != self.world.size or build.recipe.get("init_from") != self.init_digest:
            build = prepare(spec, self._build_data(), world_size=self.world.size, init_digest=self.init_digest)
        self.build = build
        self.data = build.data
        # target tokens in the validation set, over every process (each holds as many windows)
        self.eval_tokens = sum(len(x) for x, _ in self.data.val_batches) * self.layout.dp * self.recipe.seq_len
        self.experiment_id = build.experiment_id
        # A fresh run of an experiment that already FINISHED gets an id (and run directory) of its own when the
        # logger asks for it (`archspec train`): the finished run, its metrics, summary and checkpoint stay whole.
        repeat_for = getattr(self.logger, "repeat_for", None)
        self.repeat = repeat_for(self.experiment_id) if repeat_for and not self.resume_path else 0
        self.run_id = repeat_id(self.experiment_id, self.repeat) if self.repeat else self.experiment_id
        if self.resume_state is not None:
            self.run_id = self._resumed_run_id(self.resume_state)
        self.run_dir = Path(run_dir) if run_dir else (
            self.resume_path.parent if self.resume_path else default_run_dir(spec.name, self.run_id))
        if self.run_id != self.experiment_id and not self.resume_path and (self.run_dir / FILENAME).exists():
            raise UserError(f"{self.run_dir}: holds a checkpoint (of run {self.experiment_id}, which FINISHED, or of "
                            f"another run); this repeat, run {self.run_id}, needs a directory of its own: pass another "
                            "--run-dir, or none for runs/<name>-<run id>")
        self.generated, self.model = self._build_model()
        self.fp8_linears = (convert_fp8(self.model, spec, self.recipe.fp8_scaling)
                            if self.recipe.precision == "fp8" else [])
        # torchtitan's order: tensor and expert parallelism, checkpointing, compile, then data-parallel sharding; the
        # optimizer holds the sharded parameters.
        self.mesh = JobMesh.build(self.device.type, self.layout) if not self.layout.trivial else None
        self.pipeline = None  # pp > 1: this process's stages (archspec.train.pipeline); the model cut down to them
        if self.layout.pp > 1:
            from archspec.train.pipeline import Pipeline

            if callable(getattr(self.data, "scorer", None)):
                raise UserError("train.data.corpus: a capability task is scored on the logits, which pipeline "
                                "parallelism holds on the last stage only: not built; use train.parallel.pp 1")
            self.pipeline = Pipeline.build(self.model, spec, self.mesh, self.device)
        if self.mesh is not None:
            split_model(self.model, spec, self.mesh)
        self.compile_mode, self.compile_reason = self._should_compile(compile)
        self.compiled = self.compile_mode != "none"
        # Across a mesh each block's forward is compiled inside its checkpoint (torch 2.13 cannot trace a checkpoint
        # whose saved values include a DeviceMesh); elsewhere the checkpoint is traced into the block's graph.
        inside = self.compiled and self.mesh is not None
        if inside:
            self._compile_blocks(forward_only=True)
        self.checkpointed = apply_activation_checkpointing(self.model, self.recipe.activation_checkpointing)
        if self.compiled and not inside:
            self._compile_before_sharding()
        self.fsdp = self._fsdp()
        # Parameters held as DTensors (FSDP, or any split of the model): checkpoints are DCP's sharded state.
        self.sharded = self.fsdp or self.mesh is not None
        if self.mesh is not None:
            self.ddp_model = shard_data_parallel(self.model, self.mesh, self.recipe.parallel, self.device,
                                                 self.amp_dtype)
            if self.device.type == "cuda" and self.layout.dp > 1:
                self.amp_dtype_autocast = None  # FSDP's (and replicate's) bf16 parameters replace autocast
        elif self.fsdp:
            self.ddp_model = shard_fsdp(self.model, self.world, self.recipe.parallel, self.amp_dtype)
            if self.device.type == "cuda":
                self.amp_dtype_autocast = None  # FSDP's bf16 parameters replace autocast
        else:
            self.ddp_model = wrap_ddp(self.model, self.world)
        self.loss_context = self._loss_context()
        if self.pipeline is not None:
            self.pipeline.build_schedule()
        self.optimizer = build_optimizer(self.model, self.recipe, self.device, spec.model)
        self.compile_s = self._warm_up_compiled() if self.compiled else 0.0
        self.step, self.saved_step = 0, -1
        if self.resume_path:
            self._resume(self.resume_path)

        self.metrics = RunMetrics.of(build, self.world.size, peak_flops(self.device, self.amp_dtype or torch.float32,
                                                                        self.cache), self.started,
                                     data_parallel=self.layout.dp)
        self.tokens_per_step = self.metrics.tokens_per_step
        self.progress.plan(self.tokens_per_step, self.eval_tokens, self.recipe.eval_every)  # the ETA's evaluations
        self.last_eval: dict[str, float] = {}
        # train.stability: per-layer figures at each evaluation (archspec.train.metrics), None when not asked
        self.stability = StabilityProbe(self.model) if self.recipe.stability else None
        self.spikes = SpikeCounter()
        self.record_failed = False  # the logger could not write (RecordingError): the run stopped for that

    # ── setup ────────────────────────────────────────────────────────────────────────────────────────────────────

    def _build_data(self) -> TrainData:
        """Rank 0 tokenises into the cache first; the others wait, then read the same files."""
        if not self.world.is_main:
            self.world.barrier()
        # Every data-parallel replica reads its own slice of each global batch; the processes that split one
        # replica's model (tp) read the same slice.
        data = build_data(self.spec, self.cache, rank=self.coords["dp"], world=self.layout.dp)
        if self.world.is_main:
            self.world.barrier()
        return data

    def _build_model(self) -> tuple[codegen.Generated, nn.Module]:
        """Generate the spec's module into the run directory (the exact source this run trains, beside its
        checkpoint) and build it on the device from the run's seed; every rank starts from the same weights."""
        self.build = self.build.checked(self.device.type)
        self.memory_plan = self.build.memory
        generated = codegen.generate(self.spec, out_dir=self.run_dir)
        torch.manual_seed(self.recipe.seed)
        random.seed(self.recipe.seed)
        with torch.device(self.device):
            model = generated.Model()
        if self.init_weights is not None:
            load_weights_into(self.init_weights["path"], self.init_weights, model)
        # Dropout draws from a stream of its own per rank (the init stream above is shared by every rank).
        torch.manual_seed(int(digest("dropout", self.recipe.seed, self.world.rank)[:15], 16))
        return generated, model

    def _read_init(self, init_from: str | Path) -> dict[str, Any]:
        """Weights to start from (a weights checkpoint from `import-hf`, or a training checkpoint): the model section
        of their spec must be this spec's; the recipe may differ (that is what fine-tuning is)."""
        path = resolve(init_from)
        weights = load_weights(path)
        saved, now = weights["spec"].get("model"), canonical_dict(self.spec)["model"]
        if saved != now:
            from archspec.train.checkpoint import _flatten

            a, b = _flatten(saved if isinstance(saved, dict) else {}), _flatten(now)
            diffs = [f"model.{k}: weights {a.get(k)!r}, spec {b.get(k)!r}" for k in sorted(set(a) | set(b))
                     if a.get(k) != b.get(k)]
            raise UserError(f"{path}: these weights are for another architecture than {self.spec.name}'s",
                            diffs[:20] or ["(model sections differ)"])
        weights["path"] = path
        weights["digest"] = weights_digest(weights["model"])
        return weights

    def _fsdp(self) -> bool:
        """Whether FSDP2 shards this run: kind fsdp over more than one data-parallel replica (tp=2 on two
        processes has one replica: nothing to shard over)."""
        return self.world.distributed and self.recipe.parallel.kind == "fsdp" and self.layout.dp > 1

    def _replica_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over the data-parallel replicas, in place: every process without a mesh; over mesh.dp
        with one (the processes of a tensor-parallel group hold the same tokens' statistics: counted once)."""
        if self.mesh is None:
            return self.world.all_sum(tensor)
        if self.layout.dp > 1:
            torch.distributed.all_reduce(tensor, group=self.mesh.dp.get_group())
        return tensor

    def _loss_context(self):
        """The context a forward and its backward run in: under tensor parallelism the logits stay sharded by
        vocabulary and the cross-entropy is computed on the shards (loss_parallel); elsewhere nothing."""
        if self.layout.tp > 1:
            from archspec.train.tensor_parallel import loss_context

            return lambda: loss_context(self.model)
        return nullcontext

    def _should_compile(self, requested: bool | str | None) -> tuple[str, str]:
        """The compile mode of this run and why (archspec.train.compile.resolve_compile). `requested` (the
        `compile=` argument) replaces train.compile: True is per_block, False none (`--no-compile`)."""
        if requested is None:
            wanted = self.recipe.compile
        elif isinstance(requested, bool):
            wanted = "per_block" if requested else "none"
        else:
            from archspec.spec.train import COMPILE_MODES

            if requested not in COMPILE_MODES:
                raise UserError(f"train.compile: expected one of {' | '.join(COMPILE_MODES)}, got "
                                f"{printable(repr(requested), 40)}")
            wanted = requested
        mode, why = resolve_compile(wanted, self.spec, self.device, fsdp=self._fsdp(), processes=self.world.size)
        if mode in ("whole", "cudagraphs") and not self.layout.trivial:
            return "per_block", (f"{mode} refused: a model split over a mesh ({self.layout.describe()}) compiles per "
                                 f"block (whole-model graphs across tp/ep are not built); per_block")
        return mode, why

    def _compile_before_sharding(self) -> None:
        """per_block: each block, before fully_shard (torchtitan's order); whole and cudagraphs: the whole model, here
        when it is not sharded (under FSDP after sharding, in `_warm_up_compiled`: its hooks must be in place)."""
        if self.compile_mode == "per_block":
            self._compile_blocks()
        elif not self._fsdp():
            compile_whole(self.model, self.compile_mode)

    def _compile_blocks(self, forward_only: bool = False) -> None:
        """Compile each block (identical code and shapes, so one graph serves all: compile time does not grow with
        depth) and, when the model splits it out as `head(x, targets)`, the output head (final norm → logits →
        loss; eager, its log-softmax over a large vocabulary costs ~10% of a small model's step). `forward_only`
        (across a mesh): each block's forward method, so activation checkpointing can wrap the compiled forward;
        the head stays eager there (under tp its loss runs in loss_parallel, a context the graph would not see)."""
        for _, block in held_blocks(self.model):
            if forward_only:
                block.forward = torch.compile(block.forward)  # instance attribute: __call__ finds it
            else:
                block.compile()
        if callable(getattr(type(self.model), "head", None)) and not forward_only:
            self.model.head = torch.compile(self.model.head)  # instance attribute: forward's self.head finds it

    def _mark_step(self) -> None:
        """cudagraphs: a new iteration of the CUDA graph trees before each forward (the previous replay's outputs,
        already read, may be overwritten)."""
        if self.compile_mode == "cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()

    def _graphed_eval(self) -> bool:
        """Whether evaluation runs through the training's compiled graphs. A compiled forward guards on grad mode
        and on each module's `training` flag: under no_grad, or after model.eval(), it compiles again (measured on
        CPU: an inference graph per evaluation mode). So evaluation keeps grad enabled (no backward: the graph's
        saved tensors are freed with the loss) and train mode, which differ from eval mode only in dropout: only
        without dropout. Not under FSDP (a forward without backward leaves its unit states half-way; not tried) nor
        cudagraphs (a forward-only replay leaves the graph tree a pending backward; not measured without a device):
        those evaluate eager, as does a ragged last batch (another shape would be another graph)."""
        return (self.compiled and self.compile_mode != "cudagraphs" and self.spec.model.dropout == 0
                and not getattr(self, "fsdp", False) and getattr(self, "mesh", None) is None)  # (a mesh: FSDP's
        # machinery replicates or shards over dp, and tp's styles; not tried)

    def _warm_up_compiled(self) -> float:
        """Build the compiled graphs now, with a forward and backward on a dummy batch (through the sharded model
        under FSDP: every rank does it), so compile time is reported on its own and the first step is a real step.
        The RNG is forked so that compiling leaves the training random stream untouched."""
        t0 = time.perf_counter()
        if self.compile_mode in ("whole", "cudagraphs") and self.fsdp:  # after fully_shard, as torchtitan does
            compile_whole(self.model, self.compile_mode)
        dummy = torch.zeros(self.recipe.batch_size, self.recipe.seq_len, dtype=torch.long, device=self.device)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            self._mark_step()
            if self.pipeline is not None:  # every stage's graphs, through the schedule
                with self.autocast():
                    self.pipeline.train_batch(dummy, dummy.clone(), 1, self.loss_context)
            else:
                with self.loss_context():
                    with self.autocast():
                        loss = self.model(dummy, dummy.clone())[1]  # two tensors: a graph guards on `idx is targets`
                    full_value(loss).backward()
        self.model.zero_grad(set_to_none=True)
        self._sync()
        return time.perf_counter() - t0

    def _read_resume(self, path: Path) -> dict[str, Any]:
        """The checkpoint to resume, read and checked (digest, structure, finite values, same model and recipe, step
        within the run) once, before anything is built or recorded."""
        state = load_checkpoint(path)
        check_same_spec(path, state, canonical_dict(self.spec))
        if not 0 <= state["step"] <= self.recipe.steps:
            raise UserError(f"{path}: checkpoint step {state['step']} is outside this run's 0..{self.recipe.steps}")
        return state

    def _resumed_init(self) -> str | None:
        digest = self.resume_state.get("init_from") if self.resume_state is not None else None
        if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                       and all(c in "0123456789abcdef" for c in digest)):
            raise UserError(f"{self.resume_path}: init_from: expected the sha256 of the starting weights, got "
                            f"{printable(repr(digest), 80)}")
        return digest

    def _resumed_run_id(self, state: dict[str, Any]) -> str:
        """The run a checkpoint continues: the one that wrote it (its `run_id`, when it is this experiment or one of
        its repeats), else the experiment's run. A run the registry holds as FINISHED is never reopened: resumed from
        its final step there is nothing to do (AlreadyFinished); from an earlier step, the training continues as a
        new repeat of the experiment."""
        saved = state.get("run_id")
        known = {self.experiment_id, *(repeat_id(self.experiment_id, n) for n in range(1, 1001))}
        run_id = saved if isinstance(saved, str) and saved in known else self.experiment_id
        recorded = getattr(self.logger, "recorded_status", None)
        if not callable(recorded) or recorded(run_id) != FINISHED:
            return run_id
        if state["step"] >= self.recipe.steps:
            raise AlreadyFinished(run_id, state["step"])
        repeat_for = getattr(self.logger, "repeat_for", None)
        n = repeat_for(self.experiment_id) if callable(repeat_for) else 0
        if not n:  # a logger that does not train finished experiments again: the sweep's rule (skip) applies
            raise AlreadyFinished(run_id, state["step"])
        self.repeat = n
        return repeat_id(self.experiment_id, n)

    def _resume(self, path: Path) -> None:
        state = self.resume_state if self.resume_state is not None else self._read_resume(path)
        self.resume_state = None  # the weights are in the model now; the loaded copy is not kept
        sharded = sharded_directory(path, state)
        if sharded is not None:  # FSDP's sharded state: loads here whatever the world size, one process included
            load_sharded(path, sharded, self.model, self.optimizer)
            restore_hyperparameters(self.optimizer, self.model, self.recipe)
        elif self.sharded:
            raise UserError(f"{path}: a whole (non-sharded) checkpoint cannot seed a sharded run (FSDP, tp or ep) yet; "
                            "resume it on one process or under DDP without tp/ep, whose checkpoints sharded runs do not "
                            "read")
        else:
            restore_modules(path, state, self.model, self.optimizer)
        self.data.sampler.load_state_dict(state["data"])
        self.step = self.saved_step = int(state["step"])
        scaler_state = state.get("grad_scaler")
        if self.scaler is not None and isinstance(scaler_state, dict):  # fp16: the scale carries on where it was
            scaler_state = dict(scaler_state)
            self.skipped_steps = int(scaler_state.pop("skipped_steps", 0))
            try:
                self.scaler.load_state_dict(scaler_state)
            except (KeyError, TypeError, ValueError, RuntimeError) as e:
                raise UserError(f"{path}: grad_scaler: not a loss scaler's state ({e})") from None
        per_rank = state["rng"]
        set_rng_state(per_rank[self.world.rank] if len(per_rank) == self.world.size else per_rank[0])

    def run_info(self) -> RunInfo:
        d = self.data.describe()
        return RunInfo(
            spec_name=self.spec.name, model_hash=self.build.model_hash, spec_json=canonical_dict(self.spec),
            generated_hash=self.generated.source_hash,
            accounting={**self.build.accounting.to_dict(), "seq_len": self.recipe.seq_len},
            spec_accounting={**self.build.spec_accounting.to_dict(), "seq_len": self.spec.model.context_length},
            data_hash=self.data.data_hash, seed=self.recipe.seed, recipe=self.build.recipe,
            code_version=code_version(), host=socket.gethostname(),
            tags={"device": str(self.device), "precision": "float8" if self.fp8_linears else
                  str(self.amp_dtype or torch.float32).replace("torch.", ""),
                  "world_size": str(self.world.size), "compile": self.compile_mode,
                  "parallel": ("fsdp" if self.fsdp else ("ddp" if self.world.distributed else "none"))
                  + ("" if self.layout.trivial else f" {self.layout.describe()}"),
                  "activation_checkpointing": f"{len(self.checkpointed)}/{len(self.model.blocks)} blocks",
                  "corpus": d["corpus"], "corpus_hash": d["corpus_hash"], "tokenizer": d["tokenizer"],
                  "train_tokens": str(d["train_tokens"]), "val_tokens": str(d["val_tokens"]),
                  "resumed_from_step": str(self.step),
                  **({"repeat_of": self.experiment_id} if self.run_id != self.experiment_id else {}),
                  **writer_identity()},  # with `host`: lets a later resume on this host see the writer is gone
            repeat=self.repeat, key=self.build.experiment_id,
        )

    # ── one step ─────────────────────────────────────────────────────────────────────────────────────────────────

    def autocast(self) -> AbstractContextManager:
        if self.amp_dtype_autocast is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype_autocast)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _to_device(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.device.type == "cpu":
            return batch
        return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in batch)  # type: ignore[return-value]

    def _clip_gradients(self) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.pipeline is not None:  # over every stage; a weight two stages hold (tied) counted on the first only
            skip = {id(p) for p in self.pipeline.tied} if not self.pipeline.first else set()
            return clip_gradients(params, self.recipe.grad_clip, counted=[p for p in params if id(p) not in skip],
                                  stage_sum=self.pipeline.pipeline_sum)
        if self.mesh is not None:  # gradients on several meshes (tp, dp, ep): one global norm over them all
            return clip_gradients(params, self.recipe.grad_clip)
        if self.recipe.grad_clip > 0:  # under FSDP the norm is over every shard (a DTensor): its full value counts
            return full_value(torch.nn.utils.clip_grad_norm_(params, self.recipe.grad_clip))
        return full_value(torch.nn.utils.get_total_norm([p.grad for p in params]))

    def _forward_backward(self, accum: int, sync: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One micro-batch: forward, plus the model's auxiliary losses, backward of their sum scaled by 1/accum.
        DDP all-reduces the gradients only when `sync` (the last micro-batch of a step)."""
        inputs, targets = self._to_device(self.data.sampler.next_batch())
        with no_sync(self.ddp_model, sync), self.loss_context():
            self._mark_step()
            with self.autocast():
                loss = self.ddp_model(inputs, targets)[1]  # logits dropped now, not kept through backward
                # under tp a replicated DTensor: its value (differentiably), so the plain auxiliary losses add to it
                loss = full_value(loss)
                aux = self.model.auxiliary_losses() if hasattr(self.model, "auxiliary_losses") else {}
            if hasattr(self.model, "after_micro_batch"):  # state a model keeps over a step's training forwards
                self.model.after_micro_batch()
            # each auxiliary loss times the model's weight for it (multi-token prediction: λ / depth), else 1
            weights = self.model.auxiliary_weights() if hasattr(self.model, "auxiliary_weights") else {}
            total = loss + sum(weights.get(name, 1.0) * value for name, value in aux.items()) if aux else loss
            if self.scaler is not None:  # fp16: the scaled loss, so small gradients stay above fp16's smallest
                self.scaler.scale(total / accum).backward()
            else:
                (total / accum).backward()
        return (loss.detach().float(),
                {name: full_value(v.detach()).float().reshape(()) for name, v in aux.items()})

    def _pipeline_batch(self, accum: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One batch through the pipeline's schedule (its micro-batches' forwards and backwards); every stage draws
        the batch, so every stage's data position stays the same."""
        inputs, targets = self._to_device(self.data.sampler.next_batch())
        self._mark_step()
        with self.autocast():
            loss, aux = self.pipeline.train_batch(inputs, targets, accum, self.loss_context)
        return loss, aux  # (the stages count their micro-batches themselves: archspec.train.pipeline)

    def train_step(self) -> StepStats:
        """One optimizer step over `grad_accum` micro-batches. Raises NonFiniteLoss before applying a bad update."""
        t0 = time.perf_counter()
        # Where this step started: an interruption before its update is complete saves this position and RNG state, so
        # the resumed run draws the step's batches and dropout masks again, exactly as if it had never been cut.
        self.step_start = (self.data.sampler.state_dict(), rng_state())
        lr = lr_at(self.step, self.recipe)
        set_lr(self.optimizer, lr)
        accum = self.recipe.grad_accum
        loss_sum = torch.zeros((), device=self.device)
        aux_sums: dict[str, torch.Tensor] = {}
        for micro in range(accum):
            loss, aux = (self._forward_backward(accum, sync=micro == accum - 1) if self.pipeline is None
                         else self._pipeline_batch(accum))
            loss_sum += loss
            for name, value in aux.items():
                aux_sums[name] = aux_sums.get(name, 0.0) + value
        if self.pipeline is not None:
            self.pipeline.after_backward()  # a tied weight's two parts summed
            # the loss lives on the last stage, each stage holds its share of the router losses: summed over them
            stacked = self.pipeline.pipeline_sum(torch.stack([loss_sum, *aux_sums.values()]))
            loss_sum, aux_sums = stacked[0], dict(zip(aux_sums, stacked[1:]))
        probed = self.stability is not None and self.evaluates_at(self.step + 1)
        if self.scaler is not None:  # fp16: true gradients before norms and clipping (records any inf/NaN found)
            self.scaler.unscale_(self.optimizer)
        if probed:  # the step before an evaluation: per-layer gradient norms (before clipping) and the update's
            self.stability.before_update()
        grad_norm = self._clip_gradients()  # the same on every rank: DDP averaged the gradients
        # Losses averaged over ranks, so every rank agrees on stopping at a non-finite loss; one sync per step.
        losses = self.world.mean(torch.stack([loss_sum, *aux_sums.values()]) / accum)
        loss_value, *aux_values, grad_norm = torch.cat([losses, grad_norm.reshape(1).float()]).tolist()
        aux_stats = dict(zip(aux_sums, aux_values))
        # fp16: overflowed gradients are the loss scale's to handle (the step is skipped); a non-finite loss is not
        overflow = self.scaler is not None and not math.isfinite(grad_norm)
        self._check_finite(loss_value + sum(aux_values), 0.0 if overflow else grad_norm)
        with deferred_interrupts():  # never half an update: a signal now is raised once the step is whole
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # skipped when unscale_ found inf/NaN gradients
                self.scaler.update()  # halves the scale after an overflow, grows it after enough clean steps
                self.skipped_steps += overflow
            else:
                self.optimizer.step()
            if probed and not overflow:
                self.stability.after_update()
            if hasattr(self.model, "after_optimizer_step") and not overflow:  # updates outside the gradient
                self.model.after_optimizer_step(self._replica_sum)
            self.optimizer.zero_grad(set_to_none=True)
            self._sync()
            self.step += 1
            self.step_start = None
        return StepStats(loss_value, aux_stats, math.nan if overflow else grad_norm, lr, time.perf_counter() - t0)

    def _check_finite(self, loss: float, grad_norm: float) -> None:
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"non-finite loss ({loss}) at step {self.step + 1}")
        if not math.isfinite(grad_norm):
            raise NonFiniteLoss(f"non-finite gradient norm ({grad_norm}) at step {self.step + 1}")

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over the fixed validation windows (every window holds seq_len targets, so the mean of window
        means is the token mean), and its perplexity. Through the training's compiled graphs where `_graphed_eval`
        (no second compile), else eager."""
        graphed = self._graphed_eval()
        if not graphed:
            self.model.eval()
        loss_sum, windows = 0.0, 0
        kind_stats = KindStats(self.spec)  # of the kinds whose modules report statistics
        # Capability tasks (archspec.train.tasks): exact match on the answer positions, overall and per bucket.
        scorer = self.data.scorer() if callable(getattr(self.data, "scorer", None)) else None
        for i, batch in enumerate(self.data.val_batches):
            inputs, targets = self._to_device(batch)
            # the first batch (the same windows at every evaluation) also records the per-layer stability figures
            probe = self.stability is not None and i == 0
            # hooks (the probe) or another shape would make a compiled forward compile again: those batches run eager
            through_graph = graphed and not probe and len(inputs) == self.recipe.batch_size
            if self.pipeline is not None:  # stage to stage; the loss on the last stage only
                with self.autocast():
                    loss = self.pipeline.eval_batch(inputs, targets, self.loss_context)
                if loss is not None:
                    loss_sum += loss.item() * len(inputs)
                    windows += len(inputs)
                continue  # (per-layer kind statistics are not gathered across stages: not built)
            with (torch.enable_grad() if through_graph else torch.compiler.set_stance("force_eager")):
                with self.autocast(), self.stability.recording() if probe else nullcontext(), self.loss_context():
                    logits, loss = self.model(inputs, targets)
            # the rest under no_grad; the forward's graph freed (under tp the loss is a replicated DTensor and the
            # logits are sharded by vocabulary: gathered only for a task's answers)
            logits, loss = logits.detach(), full_value(loss.detach())
            if scorer is not None:
                scorer.add(full_value(logits), targets, self.data.val_buckets[i].to(targets.device))
            loss_sum += loss.item() * len(inputs)
            windows += len(inputs)
            kind_stats.add(self.model, len(inputs))
        self.model.train()
        loss_sum, windows = self.world.sum([loss_sum, windows])
        val_loss = loss_sum / windows
        out = {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700.0))}
        if scorer is not None:  # every rank holds every bucket (the same distances): the counts line up
            out.update(scorer.metrics([int(c) for c in self.world.sum(scorer.counts())]))
        out.update(kind_stats.metrics(self.world, sum(len(x) for x, _ in self.data.val_batches)))
        if self.stability is not None:
            out.update(self.stability.eval_metrics(self.world))
            out[STABILITY_PREFIX + "loss_spikes"] = float(self.spikes.count)
        return out

    # ── checkpoints ──────────────────────────────────────────────────────────────────────────────────────────────

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / FILENAME

    def save(self) -> None:
        """Rank 0 writes model, optimizer, step, data position and every rank's RNG state; the others wait. Saved
        between steps, or (interrupted) inside one whose update never happened: then the data position and RNG state
        are those the step started from."""
        mid_step = getattr(self, "step_start", None)
        rngs = [mid_step[1] if mid_step else rng_state()]
        if self.world.distributed:
            rngs = [None] * self.world.size
            torch.distributed.all_gather_object(rngs, rng_state())
        modules: dict[str, Any] = {"model": None, "optimizer": None}
        if self.sharded:  # every rank writes its shards; checkpoint.pt below commits them
            directory = self.run_dir / sharded_dirname(self.step)
            if self.world.is_main and directory.exists():
                shutil.rmtree(directory)  # a partial write of this step by an earlier, interrupted attempt
            self.world.barrier()
            modules = {"model": {}, "optimizer": {"state": {}, "param_groups": []},
                       **save_sharded(directory, self.model, self.optimizer)}
        if self.world.is_main:
            # Every metric up to this step reaches the registry before a checkpoint claims the step: a process killed
            # after the save (kill -9) and resumed from it then misses nothing (the resumed attempt keeps steps <= this).
            flush = getattr(self.logger, "flush", None)
            if callable(flush):
                try:
                    flush()
                except Exception as e:  # a busy registry must not stop training; the points stay buffered
                    self.progress.log(f"[yellow]metrics not yet flushed at step {self.step}: {_shown(e)}[/]")
            save_checkpoint(self.checkpoint_path, {
                "spec_hash": self.build.model_hash, "spec": canonical_dict(self.spec), "step": self.step,
                "run_id": self.run_id,
                **({} if self.sharded else {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}),
                "rng": rngs, "data": mid_step[0] if mid_step else self.data.sampler.state_dict(),
                "world_size": self.world.size, **({"init_from": self.init_digest} if self.init_digest else {}),
                **{k: v for k, v in modules.items() if v is not None},
                "tokenizer": tokenizer_state(self.data.tokenizer),
                **({"grad_scaler": {**self.scaler.state_dict(), "skipped_steps": self.skipped_steps}}
                   if self.scaler is not None else {}),
            })
            for old in self.run_dir.glob("checkpoint-step*.dcp"):  # superseded sharded states of this run
                if old.name != modules.get("sharded"):
                    shutil.rmtree(old, ignore_errors=True)
            if self.data.tokenizer.saves_file:  # also as a plain tokenizer.json beside it, for other tools
                try:
                    self.data.tokenizer.save(self.run_dir / TOKENIZER_FILE)
                except OSError as e:
                    raise CheckpointWriteError(f"cannot write {self.run_dir / TOKENIZER_FILE}: {e}") from None
        self.world.barrier()
        self.saved_step = self.step

    # ── the run ──────────────────────────────────────────────────────────────────────────────────────────────────

    def run(self) -> TrainResult:
        """Train to `train.steps` (from the resumed step). A non-finite loss ends the run FAILED with the last good
        checkpoint left in place; Ctrl-C ends it KILLED; any other exception ends it FAILED and propagates."""
        with last_words(self._forced_stop):
            return self._run()

    def _forced_stop(self, signum: int, notes: dict) -> None:
        """A stop the process could not make in time (archspec.signals' watchdog): the run's record ends KILLED,
        without the last save a clean stop makes; the latest checkpoint is left for the resume line."""
        checkpoint = self.checkpoint_path if self.checkpoint_path.exists() else None
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
            self.logger.log_artifact("model", str(self.generated.path))
            with self.progress:
                self._announce()
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

    def _announce(self) -> None:
        acc = self.build.accounting
        d = self.data.describe()
        precision = {torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + loss scaling"}.get(
            self.amp_dtype, "fp32")
        if self.fp8_linears:
            precision = f"fp8 ({self.recipe.fp8_scaling}) in {len(self.fp8_linears)} linears, bf16 autocast"
        self.progress.log(f"run [bold]{self.run_id}[/] · {self.spec.name} · {acc.total:,} params · "
                          f"{self.device} {precision} × {self.world.size}"
                          + ("" if self.layout.trivial else f" ({self.layout.describe()})")
                          + f" · dir {_shown(self.run_dir)}")
        self.progress.log(f"data: {_shown(d['corpus'])} · {d['tokenizer']} tokenizer · {d['train_tokens']:,} train / "
                          f"{d['val_tokens']:,} val tokens (evaluated on {self.eval_tokens:,}, every "
                          f"{self.recipe.eval_every} steps: {self._eval_share(acc):.0%} of the run's FLOPs)")
        if self.amp_dtype == torch.bfloat16 and self.device.type == "cpu":
            self.progress.log("[yellow]bf16 autocast on CPU: most CPUs have no native bf16 and run it far slower "
                              "than fp32; train.precision=auto picks fp32 here[/]")
        self.progress.log(f"compile: {self.compile_mode} ({_shown(self.compile_reason)})")
        if self.compile_mode == "per_block":
            classes = len({type(b) for b in self.model.blocks})  # one graph per distinct block class, not per layer
            self.progress.log(f"compiled {len(self.model.blocks)} blocks ({classes} block class"
                              f"{'es' if classes > 1 else ''}) in {self.compile_s:.1f} s")
        elif self.compiled:
            self.progress.log(f"compiled the whole model{' (CUDA graphs)' if self.compile_mode == 'cudagraphs' else ''}"
                              f" in {self.compile_s:.1f} s")
        if self.step:
            self.progress.log(f"resumed from step {self.step}")
        plan = self.memory_plan
        self.progress.log(f"memory plan: {plan.total / 2**30:.2f} GiB per device at the peak of a step"
                          + (f" of {plan.available / 2**30:.1f} GiB available" if plan.available else ""))

    def _eval_share(self, acc) -> float:
        """The part of the run's FLOPs its evaluations take (forward only, at the accounting's FLOPs per token)."""
        steps, every = self.recipe.steps, self.recipe.eval_every
        evals = steps // every + (1 if steps % every else 0)  # evaluates_at's steps, counted
        evaluation = evals * self.eval_tokens * acc.flops_forward
        total = evaluation + self.recipe.steps * self.tokens_per_step * acc.flops_train
        return evaluation / total if total else 0.0

    def evaluates_at(self, step: int) -> bool:
        """Whether the run evaluates once `step` steps are done."""
        return step % self.recipe.eval_every == 0 or step == self.recipe.steps

    def _record_step(self, stats: StepStats) -> None:
        self.spikes.add(stats.loss)
        metrics = self.metrics.step(stats)
        if self.scaler is not None:  # fp16: the scale the next step uses, and the overflowed steps so far
            metrics.update({"loss_scale": float(self.scaler.get_scale()), "skipped_steps": float(self.skipped_steps)})
        self.logger.log_metrics(self.step, metrics)
        self.progress.update(self.step, stats.loss, self.metrics.live_rate())

    def _sample_load(self) -> None:
        """The machine's 1-minute load average now (archspec.ablate.report compares runs' throughput only when their
        loads were alike)."""
        try:
            self.load_samples.append(os.getloadavg()[0])
        except (OSError, AttributeError):  # no load average on this platform
            pass

    def _record_eval(self) -> float:
        self._sample_load()
        began = time.monotonic()
        self.last_eval = self.evaluate()
        self.progress.evaluated(time.monotonic() - began)
        self.logger.log_metrics(self.step, self.last_eval)
        self.logger.heartbeat()
        self.progress.log(eval_line(self.step, self.recipe.steps, self.last_eval, self.metrics.since_eval(self.step)))
        return self.last_eval["val_loss"]

    def summary(self, losses: list[float]) -> dict[str, float]:
        out: dict[str, float] = {"steps": self.step, "tokens": self.step * self.tokens_per_step,
                                 "compile_s": self.compile_s, "peak_mem_bytes": peak_memory_bytes(self.device),
                                 "planned_mem_bytes": self.memory_plan.total,
                                 "params": self.build.spec_accounting.total}
        if losses:
            out["train_loss"] = losses[-1]
        if self.last_eval:
            out["eval_tokens"] = self.eval_tokens
        kind_stats = KindStats(self.spec)
        out.update({k: v for k, v in self.last_eval.items() if kind_stats.in_summary(k) and StabilityProbe.in_summary(k)})
        out.update(self.metrics.throughput())
        if self.load_samples:  # how busy the machine was: tok/s of runs measured under other loads do not compare
            out["load_average"] = sum(self.load_samples) / len(self.load_samples)
        return out

    def _save_on_stop(self) -> str:
        if self.saved_step == self.step:
            return ""
        try:
            self.save()
            return f"; checkpoint saved at step {self.step}"
        except CheckpointWriteError as e:
            return f"; {e}"

    def _finish(self, status: str, error: str | None, losses: list[float], evals: list) -> TrainResult:
        metrics = self.summary(losses)
        checkpoint = self.checkpoint_path if self.checkpoint_path.exists() else None
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
            self.progress.log(f"[red]{status}[/]: {_shown(error)}" +
                              (f" (last good checkpoint: {_shown(checkpoint)})" if checkpoint else ""))
        else:
            self.progress.log(self._closing_line(metrics))
        return TrainResult(self.run_id, status, error, self.step, metrics, losses, evals, self.run_dir, checkpoint)

    def _closing_line(self, m: dict[str, float]) -> str:
        parts = [f"[green]{FINISHED}[/] {self.step} steps"]
        if "val_loss" in m:
            parts.append(f"val loss {m['val_loss']:.4f}")
        if "tokens_per_s" in m:
            steady = self.metrics.steady_steps()
            parts.append(f"{m['tokens_per_s']:,.0f} {average_rate_label(self.step - steady + 1, self.step)} · "
                         f"{self.metrics.mfu_text(m)}")
        parts.append(f"checkpoint {_shown(self.checkpoint_path)}")
        line = " · ".join(parts)
        flag = self.metrics.flag(m)
        return line + (f"\n[yellow]warning:[/] {flag}" if flag else "")


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
