"""What a run measures of itself, apart from the loop that trains it: per-step metrics (loss, lr, gradient norm,
tokens/s, MFU, auxiliary losses), the kinds' evaluation statistics (a kind's modules report them, its unit reduces
them: `KindUnit.eval_stats` / `eval_metrics`), and the run's summary with its closing line.

The Trainer owns the model, data and optimizer; `RunMetrics` owns the numbers, so what is recorded can be read and
tested without a model."""

from __future__ import annotations

import functools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from archspec.kinds import metric_kinds
from archspec.recipe import RecipeView
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
    def of(cls, build, world_size: int, peak: tuple[float, str], started: float,
           data_parallel: int | None = None) -> RunMetrics:
        """world_size: every process (the MFU's devices); data_parallel: the replicas that read their own batches
        (world_size / (tp · pp); the tokens a step trains on), world_size when not given."""
        spec, acc = build.spec, build.accounting
        t, a = spec.train, spec.model.attention
        dp = world_size if data_parallel is None else data_parallel
        return cls(tokens_per_step=RecipeView.of(t, dp).tokens_per_step,
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


# ── stability (issue 34): what a losing variant's training looked like inside, per layer, at each evaluation ────────
#
# Keys (registry metrics at evaluation steps, when train.stability is on; the summary keeps the model-wide ones):
#   stability.layer<i>.act_rms      RMS of block i's output (the residual stream after it), first validation batch
#   stability.layer<i>.max_logit    largest attention logit of block i over the keys its mask lets each query see, as
#                                   scaled_dot_product_attention scores them (q·k · scale, 1/√head_dim unless the
#                                   call passes a scale; no kind soft-caps logits today), first validation batch
#   stability.layer<i>.grad_norm    L2 norm of block i's gradients at the step before the evaluation (before clipping)
#   stability.layer<i>.update_norm  L2 norm of what that step's optimizer update changed in block i's parameters
#   stability.outside.grad_norm / .update_norm   the same for the parameters outside the blocks (embedding, head)
#   stability.act_rms, stability.max_logit, stability.grad_norm, stability.update_norm   the largest over the layers
#   stability.loss_spikes           steps so far whose train loss is a spike (SPIKE_RULE)
# The probes cost a forward hook per block and one masked q·kᵀ per attention call on one batch per evaluation, and a
# copy of the parameters at the step before each evaluation (bench/stability_overhead.py; docs/BENCHMARKS.md).

STABILITY_PREFIX = "stability."
SPIKE_WINDOW = 20  # steps a spike is judged against
SPIKE_SIGMAS = 4.0
SPIKE_MIN_RISE = 0.05  # relative: a spike is also at least 5% above the window's mean
SPIKE_RULE = (f"a step's train loss is a spike when it exceeds the mean of the previous {SPIKE_WINDOW} steps' losses by "
              f"more than {SPIKE_SIGMAS:g} of their standard deviations and by more than {SPIKE_MIN_RISE:.0%} of "
              "that mean (no step is judged before it has that many before it)")
LOGIT_HEAD_CHUNK = 4  # query heads scored at a time: bounds the (B, heads, L, S) logits an evaluation holds


class SpikeCounter:
    """Loss spikes by SPIKE_RULE, over the steps this process has run (a resumed run starts a fresh window)."""

    def __init__(self) -> None:
        self.window: list[float] = []
        self.count = 0

    def add(self, loss: float) -> bool:
        spike = False
        if len(self.window) == SPIKE_WINDOW:
            mean = sum(self.window) / SPIKE_WINDOW
            std = (sum((x - mean) ** 2 for x in self.window) / (SPIKE_WINDOW - 1)) ** 0.5
            spike = loss > mean + SPIKE_SIGMAS * std and loss > mean * (1 + SPIKE_MIN_RISE)
            self.window.pop(0)
        self.window.append(loss)
        self.count += spike
        return spike


def max_visible_logit(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None,
                      is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """The largest logit scaled_dot_product_attention computes over the (query, key) pairs it lets through: q (B, H,
    L, d), k (B, KV, S, d) with H a multiple of KV (GQA); `attn_mask` bool (True: attend) or additive float, or
    `is_causal` (aligned top-left, as SDPA aligns it). A 0-dim fp32 tensor (-inf when nothing is visible)."""
    B, H, L, d = q.shape
    S, group = k.size(-2), H // k.size(1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if is_causal:
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    mask = attn_mask.expand(B, H, L, S) if attn_mask is not None else None
    best = torch.full((), -torch.inf, device=q.device)
    for h in range(0, H, LOGIT_HEAD_CHUNK):
        heads = torch.arange(h, min(H, h + LOGIT_HEAD_CHUNK), device=q.device)
        logits = (q[:, heads].float() @ k[:, heads // group].float().transpose(-1, -2)) * scale  # (B, chunk, L, S)
        if mask is not None:
            m = mask[:, heads]
            logits = logits.masked_fill(~m, -torch.inf) if m.dtype == torch.bool else logits + m.float()
        best = torch.maximum(best, logits.amax())
    return best


def _sdpa_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return query, key, attn_mask, is_causal, scale


class StabilityProbe:
    """Per-layer activation RMS and max attention logit during one evaluation forward (`recording`), and per-layer
    gradient and update norms around one optimizer step (`before_update` / `after_update`).

    Generic over kinds, and nothing in a generated file changes for it: the blocks are the generated Model's
    `blocks` (a forward hook each); the attention logits are read where every attention kind that scores with
    torch's `F.scaled_dot_product_attention` passes q and k to it (dense attention): while `recording`, that function
    is wrapped to score the call's q and k under its own mask before running it unchanged; the sparse patterns' one
    entry point (archspec.runtime.sparse.sparse_attention) calls `logit_observers` with q, k and the pattern's mask.
    Each score is credited to the block running. A kind that attends another way has no max-logit figure."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.blocks = list(getattr(model, "blocks", []))
        self.act_rms: dict[int, torch.Tensor] = {}
        self.max_logit: dict[int, torch.Tensor] = {}
        self.norms: dict[str, float] = {}
        self._before: dict[str, list[torch.Tensor]] | None = None
        self._layer: int | None = None

    @contextmanager
    def recording(self):
        import torch.nn.functional as F

        from archspec.runtime import sparse

        original = F.scaled_dot_product_attention

        def scored(*args, **kwargs):
            if self._layer is not None:
                self._score(*_sdpa_arguments(*args, **kwargs))
            return original(*args, **kwargs)

        def observed(q, k, visible, scale=None):
            if self._layer is not None:
                self._score(q, k, visible, scale=scale)

        handles = []
        for i, block in enumerate(self.blocks):
            handles.append(block.register_forward_pre_hook(functools.partial(self._block_input, i)))
            handles.append(block.register_forward_hook(functools.partial(self._block_output, i)))
        F.scaled_dot_product_attention = scored
        sparse.logit_observers.append(observed)
        try:
            yield
        finally:
            F.scaled_dot_product_attention = original
            sparse.logit_observers.remove(observed)
            for h in handles:
                h.remove()
            self._layer = None

    def _score(self, q, k, attn_mask=None, is_causal=False, scale=None) -> None:
        value = max_visible_logit(q.detach(), k.detach(), attn_mask, is_causal, scale)
        i = self._layer
        self.max_logit[i] = torch.maximum(self.max_logit[i], value) if i in self.max_logit else value

    def _block_input(self, i: int, module, args) -> None:
        self._layer = i

    def _block_output(self, i: int, module, args, output) -> None:
        x = output[0] if isinstance(output, tuple) else output
        self.act_rms[i] = x.detach().float().pow(2).mean().sqrt()
        self._layer = None

    def eval_metrics(self, world) -> dict[str, float]:
        """The recorded figures, averaged over processes (each saw its own first batch), with the step norms."""
        keys = [(f"layer{i}", "act_rms", v) for i, v in sorted(self.act_rms.items())]
        keys += [(f"layer{i}", "max_logit", v) for i, v in sorted(self.max_logit.items())]
        out: dict[str, float] = {}
        if keys:
            values = world.mean(torch.stack([v.reshape(()) for _, _, v in keys])).tolist()
            for (layer, name, _), value in zip(keys, values):
                out[f"{STABILITY_PREFIX}{layer}.{name}"] = value
        out.update(self.norms)
        for name in ("act_rms", "max_logit", "grad_norm", "update_norm"):
            per_layer = [v for k, v in out.items() if k.startswith(STABILITY_PREFIX + "layer") and k.endswith("." + name)]
            if per_layer:
                out[f"{STABILITY_PREFIX}{name}"] = max(per_layer)
        self.act_rms, self.max_logit, self.norms = {}, {}, {}
        return out

    # ── gradient and update norms ──

    def _grouped(self) -> dict[str, list[torch.nn.Parameter]]:
        groups: dict[str, list[torch.nn.Parameter]] = {}
        index = {id(p): f"layer{i}" for i, b in enumerate(self.blocks) for p in b.parameters()}
        for p in self.model.parameters():
            if p.requires_grad:
                groups.setdefault(index.get(id(p), "outside"), []).append(p)
        return groups

    @torch.no_grad()
    def before_update(self) -> None:
        """At the step before an evaluation, after backward (and clipping) and before the optimizer: the per-layer
        gradient norms, and a copy of the parameters to measure the update against."""
        from archspec.train.parallel import full_value

        groups = self._grouped()
        self._before = {}
        for name, params in groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                norm = full_value(torch.nn.utils.get_total_norm(grads))
                self.norms[f"{STABILITY_PREFIX}{name}.grad_norm"] = float(norm)
            self._before[name] = [p.detach().clone() for p in params]

    @torch.no_grad()
    def after_update(self) -> None:
        from archspec.train.parallel import full_value

        if self._before is None:
            return
        for name, params in self._grouped().items():
            before = self._before.get(name)
            if before is None:
                continue
            deltas = [p.detach() - b for p, b in zip(params, before)]
            self.norms[f"{STABILITY_PREFIX}{name}.update_norm"] = float(full_value(
                torch.nn.utils.get_total_norm(deltas)))
        self._before = None

    @staticmethod
    def in_summary(key: str) -> bool:
        """The summary keeps the model-wide figures; the per-layer ones stay per-evaluation metrics."""
        return not key.startswith(STABILITY_PREFIX + "layer") and not key.startswith(STABILITY_PREFIX + "outside")
