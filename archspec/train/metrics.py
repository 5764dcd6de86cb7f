"""What a run measures of itself, apart from the loop that trains it: per-step metrics (loss, lr, gradient norm,
tokens/s, MFU, auxiliary losses), the kinds' evaluation statistics (a kind's modules report them, its unit reduces
them: `KindUnit.eval_stats` / `eval_metrics`), and the run's summary with its closing line.

The Trainer owns the model, data and optimizer; `RunMetrics` owns the numbers, so what is recorded can be read and
tested without a model."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from archspec.kinds import metric_kinds
from archspec.train.throughput import OUR_CONVENTION, mfu, mfu_flag, palm_train_flops_per_token


@dataclass
class StepStats:
    loss: float  # cross-entropy, mean over the step's micro-batches and ranks
    aux: dict[str, float]  # auxiliary losses (MoE), same averaging
    grad_norm: float  # before clipping
    lr: float
    seconds: float


class KindStats:
    """The evaluation statistics of the kinds whose modules report them, summed over validation windows (weighted by
    windows) and reduced by each kind's unit into metrics."""

    def __init__(self, spec):
        self.kinds = metric_kinds(type(u) for u in spec.model.units())
        self.sums: dict[tuple[type, str], torch.Tensor] = {}

    def add(self, model: torch.nn.Module, windows: int) -> None:
        for kind in self.kinds:
            for name, value in kind.eval_stats(model).items():
                key = (kind, name)
                self.sums[key] = self.sums.get(key, 0.0) + value.float().reshape(-1) * windows

    def metrics(self, world, windows: int) -> dict[str, float]:
        """Every process holds as many windows: the mean of the per-process means is the token mean."""
        if not self.sums:
            return {}
        flat = world.mean(torch.cat(list(self.sums.values())) / windows).cpu()
        means = dict(zip(self.sums, flat.split([v.numel() for v in self.sums.values()])))
        out: dict[str, float] = {}
        for kind in self.kinds:
            out.update(kind.eval_metrics({name: v for (k, name), v in means.items() if k is kind}))
        return out

    def in_summary(self, key: str) -> bool:
        """A kind's metrics may stay per-eval only (e.g. per-layer figures); the summary keeps the others."""
        return all(kind.in_summary(key) for kind in self.kinds if key.startswith(kind.metric_prefix))


LIVE_WINDOW = 20  # steps the progress bar's tokens/s is averaged over


@dataclass(frozen=True)
class EvalWindow:
    """What the eval line says of training since the previous evaluation: the last step's learning rate, and the
    mean and largest gradient norm (before clipping) of steps first..last."""

    lr: float
    grad_norm_mean: float
    grad_norm_max: float
    first: int
    last: int


def live_rate_label(steps: int) -> str:
    """The unit of the progress bar's rate, saying what it averages: `tok/s (last 20 steps)`."""
    return "tok/s (last step)" if steps == 1 else f"tok/s (last {steps} steps)"


def average_rate_label(first: int, last: int) -> str:
    """The unit of the closing line's rate: the average over the steps the summary's `tokens_per_s` is over."""
    return f"tok/s avg (step {last})" if first >= last else f"tok/s avg (steps {first}–{last})"


@dataclass
class RunMetrics:
    """The throughput side of a run: tokens per step, FLOPs per token under both conventions, the FLOP/s ceiling."""

    tokens_per_step: int
    flops_per_token: int
    palm_flops_per_token: int | None
    peak_flops: float
    peak_source: str
    world_size: int
    started: float = field(default_factory=time.perf_counter)
    step_seconds: list[float] = field(default_factory=list)
    first_step_at: float | None = None
    since_eval_grad_norms: list[float] = field(default_factory=list)  # the console's eval line; reset by since_eval
    last_lr: float | None = None

    @classmethod
    def of(cls, build, world_size: int, peak: tuple[float, str], started: float) -> RunMetrics:
        spec, acc = build.spec, build.accounting
        t, a = spec.train, spec.model.attention
        return cls(tokens_per_step=t.batch_size * t.seq_len * t.grad_accum * world_size,
                   flops_per_token=acc.flops_train,
                   palm_flops_per_token=palm_train_flops_per_token(acc, spec.model.n_layers, a.n_heads, a.mean_head_dim),
                   peak_flops=peak[0], peak_source=peak[1], world_size=world_size, started=started)

    def step(self, stats: StepStats) -> dict[str, float]:
        """One step's metrics (recording its time for the summary's steady rate)."""
        if self.first_step_at is None:
            self.first_step_at = time.perf_counter()
        self.step_seconds.append(stats.seconds)
        self.since_eval_grad_norms.append(stats.grad_norm)
        self.last_lr = stats.lr
        tokens_per_s = self.tokens_per_step / stats.seconds
        return {"train_loss": stats.loss, "lr": stats.lr, "grad_norm": stats.grad_norm, "tokens_per_s": tokens_per_s,
                "mfu": mfu(self.flops_per_token, tokens_per_s, self.peak_flops, self.world_size),
                **{f"aux_{name}": value for name, value in stats.aux.items()}}

    def live_rate(self) -> tuple[float, int] | None:
        """The progress bar's rate: tokens/s over the last LIVE_WINDOW steps (fewer early on), measured as the
        summary's average is (step time only, the first step left out once there is another), so the two agree
        once a run is steady. Returns (tokens/s, steps it is over); None before the first step."""
        if not self.step_seconds:
            return None
        window = self._steady()[-LIVE_WINDOW:]
        return self.tokens_per_step * len(window) / sum(window), len(window)

    def _steady(self) -> list[float]:
        """The step times the rates are over: every step this process ran but its first (which also warms caches and
        allocators), or that one alone."""
        return self.step_seconds[1:] or self.step_seconds

    def steady_steps(self) -> int:
        """How many steps the summary's average rate is over."""
        return len(self._steady())

    def since_eval(self, step: int) -> EvalWindow | None:
        """The learning rate of the last step and the gradient norms of the steps since the last evaluation (this
        process's: a resumed run's first window starts at its resume), for the eval line; starts the next window."""
        norms, self.since_eval_grad_norms = self.since_eval_grad_norms, []
        if not norms or self.last_lr is None:
            return None
        return EvalWindow(lr=self.last_lr, grad_norm_mean=sum(norms) / len(norms), grad_norm_max=max(norms),
                          first=step - len(norms) + 1, last=step)

    def throughput(self) -> dict[str, float]:
        """The summary's speed figures: the steady rate (the first step also warms caches and allocators)."""
        if not self.step_seconds:
            return {}
        steady = self._steady()
        tokens_per_s = self.tokens_per_step * len(steady) / sum(steady)
        out = {"tokens_per_s": tokens_per_s, "train_s": sum(self.step_seconds),
               "mfu": mfu(self.flops_per_token, tokens_per_s, self.peak_flops, self.world_size),
               "peak_flops": self.peak_flops, "time_to_first_step_s": self.first_step_at - self.started}
        if self.palm_flops_per_token is not None:  # the convention most published MFU figures use, beside ours
            out["mfu_palm"] = mfu(self.palm_flops_per_token, tokens_per_s, self.peak_flops, self.world_size)
        # An MFU above 1 is kept as measured and flagged (the ceiling is never raised to hide it).
        out["mfu_above_ceiling"] = float(_highest_mfu(out) > 1.0)
        return out

    def mfu_text(self, m: dict[str, Any]) -> str:
        return mfu_text(self.peak_source, m)

    @staticmethod
    def flag(m: dict[str, Any]) -> str | None:
        return mfu_flag(_highest_mfu(m))


def _highest_mfu(m: dict[str, Any]) -> float:
    """The larger MFU of the two conventions: the one a too-low ceiling shows first."""
    return max(m.get("mfu", 0.0), m.get("mfu_palm", 0.0))


def mfu_text(peak_source: str, m: dict[str, Any]) -> str:
    """MFU with its ceiling and FLOP convention beside it, and the 6N+12LHQT figure for dense models."""
    ceiling = ("of this machine's measured matmul rate" if peak_source.startswith("this machine")
               else f"of the {peak_source}")
    if _highest_mfu(m) > 1.0:  # never shown as a figure: the ceiling is what is wrong
        return f"MFU not shown: above 100% {ceiling}, so that ceiling is too low"
    text = f"MFU {100 * m['mfu']:.1f}% {ceiling} ({OUR_CONVENTION}"
    if "mfu_palm" in m:
        text += f"; 6N+12LHQT: {100 * m['mfu_palm']:.1f}%"
    return text + ")"
