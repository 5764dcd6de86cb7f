"""Time estimates for `archspec ablate --dry-run`: every FLOP a run spends, at the rates the registry measured.

A run spends its time in three places, and the estimate counts each:
- training: `steps` optimizer steps, each `tokens_per_step × train FLOPs/token` plus a fixed per-step overhead (Python,
  kernel launches, the optimizer over every parameter: what makes tiny models slow);
- evaluation: `evals` passes over the fixed validation set (`train.eval_tokens`, in batches of `batch_size` windows),
  each a forward pass of `eval tokens × forward FLOPs/token` plus a per-batch overhead. At short budgets this is most of
  the run: `--steps 40` on the presets trains 41k tokens and evaluates 10 × 65k. Capability tasks (mqar, passkey) are
  scored inside these evaluations; a sweep runs no other probe;
- a fixed per-run overhead: the run's setup (data, generated module, model: the time to its first step less the
  step; the cheapest measured, since the dearer ones paid once-only costs), its record, its checkpoint, the summary.

The rates come from finished runs of this machine (runs count as similar when they ran on the same kind of device,
the `device` tag's type, in the same precision, one process; this host's only when it has any):
1. seconds per training step = a + F_step / R (F_step: train FLOPs of one step), fitted to each measured model's median
   step time by least squares with a ≥ 0 and R at most the device's measured matmul peak (`archspec peak`), so the
   cost always grows with the FLOPs; with one measured model, R is the larger of its achieved FLOP/s and the
   assumption below, and a is what is left of its step time. A model measured at the same batch uses its own median;
2. what a run spent outside its training steps (its recorded wall time, started → ended, less steps × step time) is
   evaluation plus the fixed overhead: eval FLOPs at the rate R, plus b per eval batch and c per run, fitted over the
   measured runs (when they differ in eval batches), else b = a / 3 (a forward pass without backward and optimizer)
   and c the median of what is left;
3. with no similar run at all: the stated assumption, ASSUMED_MFU of the device's peak, and no overheads.
Compile time (`--no-compile` has none) and the sweep's own start (imports, tokenising a new corpus once) are not
counted.
"""

from __future__ import annotations

import math
import socket
import statistics
from dataclasses import dataclass

from archspec.console import human
from archspec.recipe import RecipeView

# With nothing measured: small models on a CPU reach about this share of the measured matmul peak (the llama-like-tiny
# preset measured 15-30% on the development box); an assumption, and the table says so.
ASSUMED_MFU = 0.2


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

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_token * self.tokens_per_s

    @property
    def step_s(self) -> float:
        return self.batch[0] * self.batch[1] / self.tokens_per_s

    @property
    def flops_per_step(self) -> float:
        return self.flops_per_token * self.batch[0] * self.batch[1]


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
    """Seconds = steps · (a + F_step · inv_rate) + eval batches · b + eval FLOPs · inv_rate + c."""

    step_overhead: float  # a, seconds per training step
    inv_rate: float  # 1 / R, seconds per FLOP
    batch_overhead: float  # b, seconds per eval batch
    run_overhead: float  # c, seconds per run
    basis: str


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


def measured_runs(registry, device_type: str, precision: str) -> list[Measured]:
    """Finished one-process runs on this device type and precision with a recorded rate (this host's only, when it
    has any). A registry that does not exist yet reads as empty (reads never write)."""
    want_device, want_precision = device_words(device_type, precision)
    host = socket.gethostname()
    out = []
    for row in registry.runs(where="status = 'FINISHED'"):
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
        wall = getattr(row, "duration_s", None)
        setup = row.summary.get("time_to_first_step_s")
        # started → ended begins when the run is recorded, after its data, module and model were made: that setup is
        # the time to the first step less the step itself
        setup_s = (max(0.0, setup - batch[0] * batch[1] / rate)
                   if isinstance(setup, (int, float)) and math.isfinite(setup) else None)
        out.append(Measured(row.model_hash, row.name, batch, float(flops), float(rate), row.host == host,
                            wall_s=float(wall) if wall else None, steps=steps,
                            eval_batches=evals * math.ceil(windows / int(recipe["batch_size"])),
                            eval_flops=evals * eval_tokens * float(forward), setup_s=setup_s))
    if any(m.same_host for m in out):
        out = [m for m in out if m.same_host]
    return out


def _train_line(measured: list[Measured], peak: float | None) -> tuple[float, float]:
    """(a, 1/R): seconds per step = a + F_step · (1/R), from each measured model's median step time."""
    import numpy as np
    from scipy.optimize import lsq_linear

    by_model: dict[float, list[float]] = {}
    for m in measured:
        by_model.setdefault(m.flops_per_step, []).append(m.step_s)
    f = np.array(sorted(by_model))
    t = np.array([statistics.median(by_model[x]) for x in f])
    if len(f) == 1:
        rate = max(f[0] / t[0], peak * ASSUMED_MFU if peak else 0.0)
        return float(max(0.0, t[0] - f[0] / rate)), 1.0 / rate
    scale = float(f.mean())  # columns of comparable size for the solver
    floor = (1.0 / peak) * scale if peak else 0.0  # nothing runs faster than the device's matmul peak
    res = lsq_linear(np.column_stack([np.ones_like(f), f / scale]), t, bounds=([0.0, floor], [np.inf, np.inf]))
    a, inv_rate = res.x
    return float(a), float(inv_rate) / scale


def cost_model(measured: list[Measured], peak: float | None) -> CostModel | None:
    """The machine's costs from its measured runs (see the module docstring); None with nothing to go on."""
    if not measured:
        if peak:
            return CostModel(0.0, 1.0 / (peak * ASSUMED_MFU), 0.0, 0.0, f"assumed {ASSUMED_MFU:.0%} MFU")
        return None
    import numpy as np
    from scipy.optimize import nnls

    a, inv_rate = _train_line(measured, peak)
    models = len({m.flops_per_step for m in measured})
    basis = f"fit to {models} measured model{'s' if models > 1 else ''}"
    timed = [m for m in measured if m.wall_s is not None and m.steps]
    # what each run spent outside its training steps, less its eval FLOPs: c + eval batches · b
    rest = [(m.eval_batches, m.wall_s - m.steps * m.step_s - m.eval_flops * inv_rate) for m in timed]
    b, c = a / 3, 0.0
    if len({n for n, _ in rest}) > 1:
        (c, b), _ = nnls(np.array([[1.0, n] for n, _ in rest]), np.array([r for _, r in rest]))
    elif rest:
        c = max(0.0, statistics.median(r - n * b for n, r in rest))
    # Every run of a sweep makes its data, module and model again; the cheapest setup measured is what recurs (the
    # dearer ones also paid once-only costs: a corpus's first tokenising, the FLOP/s ceiling's first measurement).
    setups = [m.setup_s for m in timed if m.setup_s is not None]
    c += min(setups) if setups else 0.0
    return CostModel(float(a), float(inv_rate), float(b), float(c), basis)


def estimate(model_hash: str, batch: tuple[int, int], work: Work, measured: list[Measured],
             peak: float | None) -> Estimate:
    """Seconds of one run of a variant (`batch`: batch_size × grad_accum, seq_len): its training steps, its
    evaluations and the per-run overhead."""
    model = cost_model(measured, peak)
    if model is None:
        return Estimate(None, "no measurement, no peak")
    same = [m.step_s for m in measured if m.model_hash == model_hash and m.batch == batch]
    if same:
        step_s = statistics.median(same)
        basis = f"same model ({len(same)} run{'s' if len(same) > 1 else ''}); evaluation: {model.basis}"
    else:
        step_s = model.step_overhead + work.flops_per_step * model.inv_rate
        basis = model.basis
    train_s = work.steps * step_s
    eval_s = work.evals * work.eval_batches * model.batch_overhead + work.eval_flops * model.inv_rate
    return Estimate(train_s + eval_s + model.run_overhead, basis, train_s, eval_s, model.run_overhead)


def caption(measured: list[Measured], peak: float | None, device_type: str) -> str:
    counted = "training, evaluation and per-run overhead counted, compile and the sweep's start not"
    if measured:
        where = "this host" if measured[0].same_host else "other hosts"
        model = cost_model(measured, peak)
        return (f"times from {len(measured)} finished {device_type} run(s) on {where} in the registry (same device "
                f"type and precision): {model.step_overhead * 1e3:.1f} ms per step + FLOPs at "
                f"{human(1 / model.inv_rate)}FLOP/s, {model.batch_overhead * 1e3:.1f} ms per eval batch, "
                f"{model.run_overhead:.1f} s per run; {counted}")
    if peak:
        return (f"no finished {device_type} run in the registry to measure from: times assume {ASSUMED_MFU:.0%} of "
                f"the measured matmul peak ({human(peak)}FLOP/s) and no overheads; {counted}")
    return "no throughput measured and no peak known: no time estimate"


__all__ = ["ASSUMED_MFU", "Measured", "Work", "CostModel", "Estimate", "measured_runs", "estimate", "cost_model",
           "work_of", "eval_count", "caption", "device_words"]
