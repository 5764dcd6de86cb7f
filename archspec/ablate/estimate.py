"""Time estimates for `archspec ablate --dry-run`, from the throughput the registry has measured.

What a finished run measured: its steady training rate (`summary.tokens_per_s`, the first step left out) and so the
train FLOP/s it achieved (its accounting's train FLOPs per token × that rate). Runs count as similar when they ran on
the same kind of device (the `device` tag's type: cpu, cuda) in the same precision (`precision` tag), one process;
runs of this host are preferred when it has any (another CPU is another speed).

A variant's estimate, best source first:
1. runs of the same model with the same batch and sequence length: their median tokens/s;
2. otherwise a line through the measured models: seconds per token = a + f / R, with f the train FLOPs per token, a
   the per-token overhead (Python, launches, the optimizer: what makes tiny models slow) and R the rate at which the
   device does the FLOPs, fitted to each measured model's median by non-negative least squares. With one measured
   model there is one point for two unknowns: R is taken as the larger of that model's achieved FLOP/s and the
   assumption below, and a is what is left of its time;
3. with no similar run at all: the stated assumption, ASSUMED_MFU of the device's peak (`archspec peak`).
Compile and evaluation time are excluded throughout: the rate is training steps only.
"""

from __future__ import annotations

import math
import socket
import statistics
from dataclasses import dataclass

from archspec.console import human

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
    tokens_per_s: float
    same_host: bool

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_token * self.tokens_per_s


@dataclass(frozen=True)
class Estimate:
    seconds: float | None
    basis: str  # "same model (3 runs)", "interpolated from 4 measured models", "assumed 20% MFU"


def device_words(device_type: str, precision: str) -> tuple[str, str]:
    """The tags a run on this device type in this recipe precision records (`device`'s type, `precision`)."""
    if precision == "auto":
        precision = "bf16" if device_type == "cuda" else "fp32"
    return device_type, {"fp32": "float32", "bf16": "bfloat16"}[precision]


def measured_runs(registry, device_type: str, precision: str) -> list[Measured]:
    """Finished one-process runs on this device type and precision with a recorded rate (this host's only, when it
    has any). A registry that does not exist yet reads as empty (reads never write)."""
    want_device, want_precision = device_words(device_type, precision)
    host = socket.gethostname()
    out = []
    for row in registry.runs(where="status = 'FINISHED'"):
        rate = row.summary.get("tokens_per_s")
        flops = (row.accounting.get("flops_per_token") or {}).get("train")
        if not rate or not math.isfinite(rate) or rate <= 0 or not isinstance(flops, (int, float)) or flops <= 0:
            continue
        tags = row.tags
        if (tags.get("device", "").split(":")[0] != want_device or tags.get("precision") != want_precision
                or tags.get("world_size", "1") != "1"):
            continue
        recipe = row.recipe
        try:
            batch = (int(recipe["batch_size"]) * int(recipe.get("grad_accum", 1)), int(recipe["seq_len"]))
        except (KeyError, TypeError, ValueError):
            continue
        out.append(Measured(row.model_hash, row.name, batch, float(flops), float(rate), row.host == host))
    if any(m.same_host for m in out):
        out = [m for m in out if m.same_host]
    return out


def per_token_model(measured: list[Measured], peak: float | None) -> tuple[float, float]:
    """(a, 1/R): seconds per token = a + f · (1/R), from the measured models (see the module docstring)."""
    import numpy as np
    from scipy.optimize import nnls

    by_model: dict[float, list[float]] = {}
    for m in measured:
        by_model.setdefault(m.flops_per_token, []).append(1.0 / m.tokens_per_s)
    f = np.array(sorted(by_model))
    t = np.array([statistics.median(by_model[x]) for x in f])
    if len(f) == 1:
        rate = max(f[0] / t[0], peak * ASSUMED_MFU if peak else 0.0)
        return float(t[0] - f[0] / rate), 1.0 / rate
    scale = float(f.mean())  # columns of comparable size for the solver
    (a, inv_rate), _ = nnls(np.column_stack([np.ones_like(f), f / scale]), t)
    return float(a), float(inv_rate) / scale


def estimate(model_hash: str, batch: tuple[int, int], flops_per_token: float, tokens: int, measured: list[Measured],
             peak: float | None) -> Estimate:
    """Seconds of training for `tokens` tokens of one variant (see the module docstring for the order of sources)."""
    same = [m.tokens_per_s for m in measured if m.model_hash == model_hash and m.batch == batch]
    if same:
        return Estimate(tokens / statistics.median(same), f"same model ({len(same)} run{'s' if len(same) > 1 else ''})")
    if measured:
        a, inv_rate = per_token_model(measured, peak)
        models = len({m.flops_per_token for m in measured})
        return Estimate(tokens * (a + flops_per_token * inv_rate),
                        f"fit to {models} measured model{'s' if models > 1 else ''}")
    if peak:
        return Estimate(flops_per_token * tokens / (peak * ASSUMED_MFU), f"assumed {ASSUMED_MFU:.0%} MFU")
    return Estimate(None, "no measurement, no peak")


def caption(measured: list[Measured], peak: float | None, device_type: str) -> str:
    if measured:
        where = "this host" if measured[0].same_host else "other hosts"
        return (f"times from the training rates of {len(measured)} finished {device_type} run(s) on {where} in the "
                f"registry (same device type and precision), compile and evaluation excluded")
    if peak:
        return (f"no finished {device_type} run in the registry to measure from: times assume {ASSUMED_MFU:.0%} of "
                f"the measured matmul peak ({human(peak)}FLOP/s), compile and evaluation excluded")
    return "no throughput measured and no peak known: no time estimate"


__all__ = ["ASSUMED_MFU", "Measured", "Estimate", "measured_runs", "estimate", "per_token_model", "caption",
           "device_words"]
