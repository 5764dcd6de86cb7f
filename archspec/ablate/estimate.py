"""Time estimates for `archspec ablate --dry-run`: every FLOP a run spends, at the rates the registry measured, with
the error those rates had on the runs they came from.

A sweep spends its time in four places, and the estimate counts each:
- training: `steps` optimizer steps, each `tokens_per_step × train FLOPs/token` plus a fixed per-step overhead (Python,
  kernel launches, the optimizer over every parameter: what makes tiny models slow);
- evaluation: `evals` passes over the fixed validation set (`train.eval_tokens`, in batches of `batch_size` windows),
  each a forward pass of `eval tokens × forward FLOPs/token` plus a per-batch overhead. Capability tasks (mqar,
  passkey) are scored inside these evaluations; a sweep runs no other probe;
- a fixed per-run overhead: what the run's record holds besides its steps and evaluations (its first step's warm-up,
  the checkpoint, the summary) plus what lies between two runs of one process (the next run's data, generated module
  and model, made before it is recorded);
- the sweep's own start, once: process start (imports), loading and checking the sweep, up to its first run's record.

The rates come from finished runs of this machine (runs count as similar when they ran on the same kind of device,
the `device` tag's type, in the same precision, one process; this host's only when it has any):
1. seconds per training step = a + F_step / R (F_step: train FLOPs of one step), fitted to each measured model's median
   step time by least squares with a ≥ 0 and R at most the device's measured matmul peak (`archspec peak`), so the
   cost always grows with the FLOPs. When the measured models do not differ enough in F_step to tell a from R (one
   model size, or sizes within SPREAD of each other: the two variants of an FFN ablation at equal FLOPs), their pooled
   median step time is taken as measured and other sizes are scaled from it at R, the larger of its achieved FLOP/s
   and the assumption below (a is what is left of its step time). A model measured at the same batch uses its own
   median;
2. what a run's record spent outside its training steps (started → ended, less steps × step time) is evaluation plus
   the in-record overhead: eval FLOPs at the rate R, plus b per eval batch and c per run, fitted over the measured
   runs (when they differ in eval batches), else b = a / 3 (a forward pass without backward and optimizer) and c the
   median of what is left, never below 0;
3. between runs: the median gap from one run's end to the next run's record in the same process (the runs' writer
   tags: boot, pid, process start); without such a pair, the cheapest setup measured (time to first step less the
   step; the dearer ones paid once-only costs such as a corpus's first tokenising);
4. the sweep's start: the median, over the processes that recorded runs in this boot of this machine, of process
   start (the `pid_start` tag, clock ticks since boot) to its first run's record, less one run's setup (counted in
   that run). Runs of another boot cannot be placed in time, so with none of this boot it is not counted, and said;
5. with no similar run at all: the stated assumption, ASSUMED_MFU of the device's peak, and no overheads.

The error is measured, not assumed: leave-one-out over the finished runs (at most LOO_RUNS, the latest), each run's
time (its record plus the gap before it) predicted from the others by the same rules, reported as the median absolute
error in percent; with fewer than MIN_LOO runs there is none to show, and the dry run says so. Compile time
(`--no-compile` has none) and the report written at the end are not counted.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise

from archspec.console import human
from archspec.recipe import RecipeView

# With nothing measured: small models on a CPU reach about this share of the measured matmul peak (the llama-like-tiny
# preset measured 15-30% on the development box); an assumption, and the table says so.
ASSUMED_MFU = 0.2
# Measured models whose FLOPs per step lie within this ratio of each other cannot tell a per-step overhead from a FLOP
# rate (the line through them is noise): they are read as one model size.
SPREAD = 1.5
# The error needs this many timed runs (each predicted from at least two others); it is computed over the latest
# LOO_RUNS of them (each is one fit over the rest).
MIN_LOO = 3
LOO_RUNS = 100


@dataclass(frozen=True)
class Measured:
    """What one finished run measured."""

    model_hash: str
    name: str
    batch: tuple[int, int]  # (batch_size × grad_accum, seq_len)
    flops_per_token: float  # train, at the run's seq_len
    tokens_per_s: float  # steady training rate (steps only)
    same_host: bool
    wall_s: float | None = None  # started → ended: training, evaluation and the run's own overhead
    steps: int = 0
    eval_batches: int = 0  # forward batches over the whole run (evals × batches per eval)
    eval_flops: float = 0.0  # forward FLOPs over the whole run's evaluations
    setup_s: float | None = None  # before the run was recorded: its data, generated module and model
    gap_s: float | None = None  # the previous run of its process ended → this run recorded; None for a first run
    start_s: float | None = None  # its process started → this run recorded (a process's first run, this boot only)
    started: float | None = None  # seconds since the epoch: the order the error's latest runs are taken in

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_token * self.tokens_per_s

    @property
    def step_s(self) -> float:
        return self.batch[0] * self.batch[1] / self.tokens_per_s

    @property
    def flops_per_step(self) -> float:
        return self.flops_per_token * self.batch[0] * self.batch[1]

    @property
    def between_s(self) -> float | None:
        """What the run cost outside its record: the gap before it in its process, else its own setup."""
        return self.gap_s if self.gap_s is not None else self.setup_s

    @property
    def run_s(self) -> float | None:
        """The run's time as the estimate counts it (its record and what came before it); None when not timed."""
        if self.wall_s is None or not self.steps or self.between_s is None:
            return None
        return self.wall_s + self.between_s


@dataclass(frozen=True)
class Work:
    """What one run of a variant does: its steps and evaluations (from its spec: `work_of`)."""

    steps: int
    tokens_per_step: int
    flops_train_per_token: float
    flops_forward_per_token: float
    evals: int
    eval_batches: int  # per evaluation
    eval_tokens: int  # per evaluation

    @property
    def train_flops(self) -> float:
        return self.steps * self.tokens_per_step * self.flops_train_per_token

    @property
    def eval_flops(self) -> float:
        return self.evals * self.eval_tokens * self.flops_forward_per_token

    @property
    def flops_per_step(self) -> float:
        return self.tokens_per_step * self.flops_train_per_token

    @property
    def eval_flop_share(self) -> float:
        """The part of the run's FLOPs its evaluations take (machine-independent, unlike the time share)."""
        total = self.train_flops + self.eval_flops
        return self.eval_flops / total if total else 0.0


@dataclass(frozen=True)
class CostModel:
    """Seconds = steps · (a + F_step · inv_rate) + eval batches · b + eval FLOPs · inv_rate + c; once per sweep,
    start_s."""

    step_overhead: float  # a, seconds per training step
    inv_rate: float  # 1 / R, seconds per FLOP
    batch_overhead: float  # b, seconds per eval batch
    run_overhead: float  # c, seconds per run (in its record and between runs)
    basis: str
    between_s: float = 0.0  # the part of c that lies between runs (in the gap before a run's record)
    start_s: float | None = None  # the sweep's start; None: not measured (no process of this boot recorded a run)
    starts: int = 0  # processes the start is the median of
    pooled: tuple[float, float] | None = None  # (F_step, step s) when the measured sizes could not separate a from R


@dataclass(frozen=True)
class Estimate:
    seconds: float | None
    basis: str  # "same model (3 runs)", "fit to 4 measured models", "assumed 20% MFU"
    train_s: float = 0.0
    eval_s: float = 0.0
    fixed_s: float = 0.0

    @property
    def eval_share(self) -> float | None:
        """The part of the run's time its evaluations take (None without an estimate)."""
        return self.eval_s / self.seconds if self.seconds else None


@dataclass(frozen=True)
class Accuracy:
    """Leave-one-out: each timed run's time predicted from the other runs."""

    runs: int
    median_abs: float  # |predicted − actual| / actual, median over the runs
    worst: float  # the largest of them
    bias: float  # median of (predicted − actual) / actual: below 0, the estimates run short

    def text(self) -> str:
        lean = (f"typically {abs(self.bias):.0%} {'short' if self.bias < 0 else 'long'}"
                if abs(self.bias) >= 0.005 else "no lean either way")
        return (f"past runs predicted within ±{self.median_abs:.0%} (median abs. error, {self.runs} runs, "
                f"leave-one-out; worst {self.worst:.0%}, {lean})")


def eval_count(steps: int, every: int) -> int:
    """Evaluations the loop makes: at every multiple of `every` and at the last step."""
    return steps // every + (1 if steps % every else 0)


def work_of(spec, accounting) -> Work:
    """A variant's work from its spec (train section) and accounting. The validation set is ceil(eval_tokens /
    seq_len) windows (fewer only when the split is smaller), `batch_size` windows a batch (archspec.train.data)."""
    t = spec.train
    windows = -(-max(1, t.eval_size) // t.seq_len)
    return Work(steps=t.steps, tokens_per_step=RecipeView.of(t).tokens_per_step,
                flops_train_per_token=float(accounting.flops_train), flops_forward_per_token=float(accounting.flops_forward),
                evals=eval_count(t.steps, t.eval_every), eval_batches=-(-windows // t.batch_size),
                eval_tokens=windows * t.seq_len)


def device_words(device_type: str, precision: str) -> tuple[str, str]:
    """The tags a run on this device type in this recipe precision records (`device`'s type, `precision`)."""
    if precision == "auto":
        precision = "bf16" if device_type == "cuda" else "fp32"
    # the loop's `precision` tag (archspec.train.loop.Trainer.run_info): fp8 runs record float8
    return device_type, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8"}[precision]


def _recorded_eval_every(recipe: dict, batch: tuple[int, int]) -> int:
    """Steps between a recorded run's evaluations, by the rule its recipe was trained under (resolved_eval). A recipe
    recorded before the budget rule holds eval_tokens (65,536 by default then) and so gets the ten points it had."""
    from archspec.spec.train import resolved_eval

    return resolved_eval(int(recipe["steps"]), batch[0] * batch[1], recipe.get("eval_interval"),
                         recipe.get("eval_tokens"))[0]


def boot_clock() -> tuple[str, float] | None:
    """(this boot's id, the epoch second it began at, from /proc/uptime), to place a `pid_start` tag (clock ticks
    since boot) in time; None off Linux."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (boot, time.time() - uptime) if boot else None


def _process_started(tags: dict, clock: tuple[str, float] | None) -> float | None:
    """When the run's writer process started (epoch seconds), when it ran in this boot; else None."""
    if clock is None or tags.get("boot_id") != clock[0]:
        return None
    try:
        ticks = int(tags.get("pid_start") or "")
        return clock[1] + ticks / os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return None


def _epoch(t: datetime | None) -> float | None:
    if t is None:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def measured_runs(registry, device_type: str, precision: str, clock: tuple[str, float] | None = None) -> list[Measured]:
    """Finished one-process runs on this device type and precision with a recorded rate (this host's only, when it
    has any). A registry that does not exist yet reads as empty (reads never write). `clock`: this boot (boot_clock,
    read here when not given), to time the sweep's start from the writer tags."""
    want_device, want_precision = device_words(device_type, precision)
    host = socket.gethostname()
    clock = clock if clock is not None else boot_clock()
    rows = registry.runs()
    # The writer of each row (a process), and its runs in the order they were recorded: the gaps between them
    by_process: dict[tuple[str, ...], list] = {}
    for row in rows:
        tags = row.tags
        if row.started is not None and all(tags.get(k) for k in ("boot_id", "pid", "pid_start")):
            by_process.setdefault((row.host or "", tags["boot_id"], tags["pid"], tags["pid_start"]), []).append(row)
    gap: dict[str, float] = {}
    start: dict[str, float] = {}
    for key, runs in by_process.items():
        runs.sort(key=lambda r: _epoch(r.started))
        for before, after in pairwise(runs):
            if before.ended is not None:
                gap[after.id] = max(0.0, _epoch(after.started) - _epoch(before.ended))
        began = _process_started(runs[0].tags, clock) if key[0] == host else None
        if began is not None and 0.0 <= _epoch(runs[0].started) - began < 86_400:
            start[runs[0].id] = _epoch(runs[0].started) - began
    out = []
    for row in rows:
        if row.status != "FINISHED":
            continue
        rate = row.summary.get("tokens_per_s")
        flops = (row.accounting.get("flops_per_token") or {}).get("train")
        forward = (row.accounting.get("flops_per_token") or {}).get("forward") or (flops or 0) / 3
        if not rate or not math.isfinite(rate) or rate <= 0 or not isinstance(flops, (int, float)) or flops <= 0:
            continue
        tags = row.tags
        if (tags.get("device", "").split(":")[0] != want_device or tags.get("precision") != want_precision
                or tags.get("world_size", "1") != "1"):
            continue
        recipe = row.recipe
        try:
            batch = (int(recipe["batch_size"]) * int(recipe.get("grad_accum", 1)), int(recipe["seq_len"]))
            steps = int(row.summary.get("steps") or recipe["steps"])
            every = _recorded_eval_every(recipe, batch)
        except (KeyError, TypeError, ValueError):
            continue
        eval_tokens = float(row.summary.get("eval_tokens") or 0)
        windows = eval_tokens / batch[1]
        evals = eval_count(steps, every) if eval_tokens else 0
        # a resumed run's record holds only its last attempt (started is reset), not every step: not timed
        resumed = tags.get("resumed_from_step", "0") not in ("0", "")
        wall = None if resumed else getattr(row, "duration_s", None)
        setup = row.summary.get("time_to_first_step_s")
        # started → ended begins when the run is recorded, after its data, module and model were made: that setup is
        # the time to the first step less the step itself
        setup_s = (max(0.0, setup - batch[0] * batch[1] / rate)
                   if isinstance(setup, (int, float)) and math.isfinite(setup) else None)
        out.append(Measured(row.model_hash, row.name, batch, float(flops), float(rate), row.host == host,
                            wall_s=float(wall) if wall else None, steps=steps,
                            eval_batches=evals * math.ceil(windows / int(recipe["batch_size"])),
                            eval_flops=evals * eval_tokens * float(forward), setup_s=setup_s,
                            gap_s=None if resumed else gap.get(row.id), start_s=start.get(row.id),
                            started=_epoch(row.started)))
    if any(m.same_host for m in out):
        out = [m for m in out if m.same_host]
    return out


def _train_line(measured: list[Measured], peak: float | None) -> tuple[float, float, tuple[float, float] | None]:
    """(a, 1/R, pooled): seconds per step = a + F_step · (1/R), from each measured model's median step time. `pooled`
    (F_step, step s) when the measured sizes are too alike to separate a from R (SPREAD)."""
    import numpy as np
    from scipy.optimize import lsq_linear

    by_model: dict[float, list[float]] = {}
    for m in measured:
        by_model.setdefault(m.flops_per_step, []).append(m.step_s)
    f = np.array(sorted(by_model))
    t = np.array([statistics.median(by_model[x]) for x in f])
    if f[-1] < SPREAD * f[0]:
        # one size, as far as a line can tell: its step time as measured (the median over every run), other sizes
        # scaled from it at the larger of its FLOP rate and the assumed one
        f0 = float(statistics.median(m.flops_per_step for m in measured))
        t0 = float(statistics.median(m.step_s for m in measured))
        rate = max(f0 / t0, peak * ASSUMED_MFU if peak else 0.0)
        return float(max(0.0, t0 - f0 / rate)), 1.0 / rate, (f0, t0)
    scale = float(f.mean())  # columns of comparable size for the solver
    floor = (1.0 / peak) * scale if peak else 0.0  # nothing runs faster than the device's matmul peak
    res = lsq_linear(np.column_stack([np.ones_like(f), f / scale]), t, bounds=([0.0, floor], [np.inf, np.inf]))
    a, inv_rate = res.x
    return float(a), float(inv_rate) / scale, None


def cost_model(measured: list[Measured], peak: float | None) -> CostModel | None:
    """The machine's costs from its measured runs (see the module docstring); None with nothing to go on."""
    if not measured:
        if peak:
            return CostModel(0.0, 1.0 / (peak * ASSUMED_MFU), 0.0, 0.0, f"assumed {ASSUMED_MFU:.0%} MFU")
        return None
    import numpy as np
    from scipy.optimize import nnls

    a, inv_rate, pooled = _train_line(measured, peak)
    models = len({m.flops_per_step for m in measured})
    basis = f"fit to {models} measured model{'s' if models > 1 else ''}"
    if pooled is not None and models > 1:
        basis = f"{models} measured models of alike FLOPs, pooled"
    timed = [m for m in measured if m.wall_s is not None and m.steps]
    # what each record spent outside its training steps, less its eval FLOPs: c + eval batches · b
    rest = [(m.eval_batches, m.wall_s - m.steps * m.step_s - m.eval_flops * inv_rate) for m in timed]
    b, c = a / 3, 0.0
    if len({n for n, _ in rest}) > 1:
        (c, b), _ = nnls(np.array([[1.0, n] for n, _ in rest]), np.array([r for _, r in rest]))
    elif rest:
        c = max(0.0, statistics.median(r - n * b for n, r in rest))
    # Between runs: the gaps one process left between its runs; without any, the cheapest setup measured (the dearer
    # ones also paid once-only costs: a corpus's first tokenising, the FLOP/s ceiling's first measurement).
    gaps = [m.gap_s for m in measured if m.gap_s is not None]
    setups = [m.setup_s for m in timed if m.setup_s is not None]
    between = statistics.median(gaps) if gaps else (min(setups) if setups else 0.0)
    starts = [m.start_s for m in measured if m.start_s is not None]
    start = max(0.0, statistics.median(starts) - between) if starts else None
    return CostModel(float(a), float(inv_rate), float(b), float(c + between), basis, between_s=float(between),
                     start_s=start, starts=len(starts), pooled=pooled)


def _predict(model: CostModel, measured: list[Measured], model_hash: str, batch: tuple[int, int], steps: int,
             flops_per_step: float, eval_batches: int, eval_flops: float) -> Estimate:
    """One run's seconds from the cost model (eval_batches, eval_flops: over the whole run)."""
    same = [m.step_s for m in measured if m.model_hash == model_hash and m.batch == batch]
    if same:
        step_s = statistics.median(same)
        basis = f"same model ({len(same)} run{'s' if len(same) > 1 else ''}); evaluation: {model.basis}"
    else:
        step_s = model.step_overhead + flops_per_step * model.inv_rate
        basis = model.basis
    train_s = steps * step_s
    eval_s = eval_batches * model.batch_overhead + eval_flops * model.inv_rate
    return Estimate(train_s + eval_s + model.run_overhead, basis, train_s, eval_s, model.run_overhead)


def estimate(model_hash: str, batch: tuple[int, int], work: Work, measured: list[Measured],
             peak: float | None) -> Estimate:
    """Seconds of one run of a variant (`batch`: batch_size × grad_accum, seq_len): its training steps, its
    evaluations and the per-run overhead (the sweep's start is `sweep_start`, once per sweep)."""
    model = cost_model(measured, peak)
    if model is None:
        return Estimate(None, "no measurement, no peak")
    return _predict(model, measured, model_hash, batch, work.steps, work.flops_per_step,
                    work.evals * work.eval_batches, work.eval_flops)


def sweep_start(measured: list[Measured], peak: float | None = None) -> float | None:
    """Seconds a sweep takes before its first run's record (once); None when no process of this boot measured it."""
    model = cost_model(measured, peak)
    return model.start_s if model is not None else None


def accuracy(measured: list[Measured], peak: float | None) -> Accuracy | None:
    """Leave-one-out error of the per-run estimate over the latest LOO_RUNS timed runs: each predicted from all the
    other measured runs by the same rules the dry run uses. None with fewer than MIN_LOO timed runs."""
    timed = [i for i, m in enumerate(measured) if m.run_s is not None and m.run_s > 0]
    if len(timed) < MIN_LOO:
        return None
    timed = sorted(timed, key=lambda i: measured[i].started or 0.0)[-LOO_RUNS:]
    errors = []
    for i in timed:
        m = measured[i]
        others = measured[:i] + measured[i + 1:]
        model = cost_model(others, peak)
        if model is None:
            continue
        got = _predict(model, others, m.model_hash, m.batch, m.steps, m.flops_per_step, m.eval_batches,
                       m.eval_flops).seconds
        errors.append((got - m.run_s) / m.run_s)
    if len(errors) < MIN_LOO:
        return None
    return Accuracy(len(errors), statistics.median(abs(e) for e in errors), max(abs(e) for e in errors),
                    statistics.median(errors))


def accuracy_text(measured: list[Measured], peak: float | None) -> str:
    found = accuracy(measured, peak)
    if found is not None:
        return found.text()
    timed = sum(m.run_s is not None for m in measured)
    return f"no error yet: fewer than {MIN_LOO} timed runs ({timed})"


def caption(measured: list[Measured], peak: float | None, device_type: str) -> str:
    if measured:
        where = "this host" if measured[0].same_host else "other hosts"
        model = cost_model(measured, peak)
        if model.pooled is not None:
            f0, t0 = model.pooled
            steps = (f"{t0 * 1e3:.1f} ms per step as measured at {human(f0)}FLOP a step (one model size: overhead and "
                     f"FLOP rate not separable; other sizes scaled at {human(1 / model.inv_rate)}FLOP/s)")
        else:
            steps = f"{model.step_overhead * 1e3:.1f} ms per step + FLOPs at {human(1 / model.inv_rate)}FLOP/s"
        if model.start_s is not None:
            start = (f"the sweep's start {model.start_s:.1f} s (median of {model.starts} process(es) of this boot: "
                     "process start to its first run) counted; compile and the report at the end not")
        else:
            start = "compile, the sweep's start and the report at the end not counted (no process of this boot timed)"
        return (f"times from {len(measured)} finished {device_type} run(s) on {where} in the registry (same device "
                f"type and precision): {steps}, {model.batch_overhead * 1e3:.1f} ms per eval batch, "
                f"{model.run_overhead:.1f} s per run ({model.between_s:.1f} s of it between runs); "
                f"{accuracy_text(measured, peak)}; training, evaluation and per-run overhead counted, {start}")
    counted = "training, evaluation and per-run overhead counted, compile, the sweep's start and the report not"
    if peak:
        return (f"no finished {device_type} run in the registry to measure from: times assume {ASSUMED_MFU:.0%} of "
                f"the measured matmul peak ({human(peak)}FLOP/s) and no overheads; no error yet: nothing measured; "
                f"{counted}")
    return "no throughput measured and no peak known: no time estimate"


__all__ = ["ASSUMED_MFU", "SPREAD", "MIN_LOO", "LOO_RUNS", "Measured", "Work", "CostModel", "Estimate", "Accuracy",
           "measured_runs", "estimate", "cost_model", "sweep_start", "accuracy", "accuracy_text", "boot_clock",
           "work_of", "eval_count", "caption", "device_words"]
