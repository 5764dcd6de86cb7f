"""Scaling-law fits over finished runs in the registry: L(x) = E + A·x^(−α), with bootstrap intervals over seeds.

x is the non-embedding parameter count N (active parameters for routed experts) when every run of a group trained on
the same number of tokens, else the training compute C = train FLOPs per token × tokens (`over="auto"`). N follows
Kaplan et al. (2020): the token and position embeddings and an untied LM head (the vocabulary matrices) are left out;
it comes from each run's recorded accounting (`archspec.accounting`): `params.active − params.embedding −
params.by_component.lm_head`. C is the run's own `flops_per_token.train` (exact matmul FLOPs at its seq_len, train =
3 × forward) times the tokens it trained on.

The fit: least squares (scipy.optimize.least_squares, trust-region reflective, E ≥ 0, 0 ≤ α ≤ ALPHA_MAX) on the mean
loss over seeds at each distinct x, started from the best of a grid over E (for each E, log(L − E) against log x is a
line). The interval: a percentile bootstrap over seeds: each replicate redraws, at every x, as many seeds as it has
(with replacement), refits, and the 2.5th and 97.5th percentiles of each parameter over the replicates are the 95%
interval. It measures seed noise only (not the choice of sizes or the functional form), and needs more than one seed
at some x.

Runs are grouped before fitting: by data (the data hash) and by architecture, i.e. the model spec with its size keys
(SIZE_KEYS, at any depth) removed, so two architectures in one sweep get one fit each. `by=` groups by given run
fields instead (`params.model.ffn.kind`, `params.train.lr`, `tags.device`, ...).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from archspec.errors import UserError, printable

PARAMS = ("E", "A", "alpha")
N_PARAMS = len(PARAMS)
ALPHA_MAX = 10.0
LEVEL = 0.95
# Keys that set a model's size, not its kind: removed from the model spec before runs are grouped by architecture.
SIZE_KEYS = frozenset({"d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "shared_hidden_dim"})
OVER = ("auto", "params", "compute")
X_NAMES = {"params": "non-embedding parameters N", "compute": "training compute C (FLOPs)"}


# ── the fit ──────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class PowerLaw:
    """L(x) = E + A·x^(−α)."""

    E: float
    A: float
    alpha: float

    def __call__(self, x: Any) -> Any:
        return self.E + self.A * np.power(np.asarray(x, dtype=float), -self.alpha)

    def as_dict(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha}


def _check_points(x: np.ndarray, y: np.ndarray) -> None:
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("x and y must be 1-D and of equal length")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise UserError("scaling fit: every x and loss must be a finite number")
    if np.any(x <= 0):
        raise UserError("scaling fit: every x (parameters or FLOPs) must be positive")
    distinct = len(np.unique(x))
    if distinct < N_PARAMS:
        raise UserError(f"scaling fit: {distinct} distinct size{'s' if distinct != 1 else ''}, fewer than the "
                        f"{N_PARAMS} parameters of L = E + A·x^(−α); it needs runs at {N_PARAMS} or more sizes")


def _grid_start(lx: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(E, log B, α) of the best line log(y − E) = log B − α·lx over a grid of E in [0, min y)."""
    best: tuple[float, tuple[float, float, float]] | None = None
    for E in np.linspace(0.0, float(y.min()) * 0.999, 64):
        slope, intercept = np.polyfit(lx, np.log(y - E), 1)
        alpha = float(np.clip(-slope, 0.0, ALPHA_MAX))
        pred = E + np.exp(intercept - alpha * lx)
        sse = float(np.sum((pred - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, (float(E), float(intercept), alpha))
    assert best is not None
    return best[1]


def fit_power_law(x: Sequence[float], y: Sequence[float], start: tuple[float, float, float] | None = None
                  ) -> PowerLaw:
    """Least-squares fit of L = E + A·x^(−α) to points (x, y), x > 0. Raises UserError with the reason when the points
    cannot determine three parameters (fewer than three distinct x). `start` (E, log B, α), with B = A·x0^(−α) at the
    geometric mean x0 of x, skips the grid search (the bootstrap starts each replicate from the full fit)."""
    from scipy.optimize import least_squares

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    _check_points(x, y)
    if np.any(y <= 0):
        raise UserError("scaling fit: losses must be positive (L = E + A·x^(−α) with E ≥ 0)")
    x0 = float(np.exp(np.mean(np.log(x))))  # x / x0 near 1: the three parameters on comparable scales
    lx = np.log(x / x0)
    E0, logB0, alpha0 = start if start is not None else _grid_start(lx, y)
    # least_squares wants a start strictly inside the bounds
    p0 = np.array([min(max(E0, 1e-12), float(y.min())), logB0, min(max(alpha0, 1e-6), ALPHA_MAX - 1e-6)])

    def residuals(p: np.ndarray) -> np.ndarray:
        return p[0] + np.exp(p[1] - p[2] * lx) - y

    result = least_squares(residuals, p0, bounds=([0.0, -np.inf, 0.0], [np.inf, np.inf, ALPHA_MAX]), method="trf",
                           x_scale="jac")
    E, logB, alpha = (float(v) for v in result.x)
    return PowerLaw(E=E, A=float(np.exp(logB + alpha * math.log(x0))), alpha=alpha)


@dataclass
class FitResult:
    law: PowerLaw
    rss: float  # residual sum of squares on the means
    interval: dict[str, tuple[float, float]] | None  # 95% percentile bootstrap over seeds; None: no seed variation
    n_boot: int  # replicates that were fitted
    boot: np.ndarray | None = field(default=None, repr=False)  # (n_boot, 3): E, A, α per replicate
    note: str | None = None  # why there is no interval, or what to keep in mind


def fit_with_intervals(x: Sequence[float], losses: Sequence[Sequence[float]], n_boot: int = 1000, seed: int = 0,
                       level: float = LEVEL) -> FitResult:
    """Fit the mean loss at each x, and bootstrap over seeds: `losses[i]` are the final losses of the seeds run at
    `x[i]` (one x per entry). Deterministic for a given `seed`."""
    x = np.asarray(x, dtype=float)
    groups = [np.asarray(v, dtype=float) for v in losses]
    if len(groups) != len(x) or any(len(g) == 0 for g in groups):
        raise ValueError("one non-empty list of losses per x")
    means = np.array([g.mean() for g in groups])
    law = fit_power_law(x, means)
    rss = float(np.sum((law(x) - means) ** 2))
    if all(len(g) == 1 for g in groups):
        return FitResult(law, rss, None, 0, None, "one run per size: no seed variation to bootstrap an interval from")
    x0 = float(np.exp(np.mean(np.log(x))))
    start = (law.E, math.log(law.A) - law.alpha * math.log(x0), law.alpha)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        sample = np.array([g[rng.integers(0, len(g), len(g))].mean() for g in groups])
        try:
            b = fit_power_law(x, sample, start=start)
        except (UserError, ValueError, FloatingPointError):
            continue
        draws.append((b.E, b.A, b.alpha))
    if not draws:
        return FitResult(law, rss, None, 0, None, "no bootstrap replicate could be fitted")
    boot = np.array(draws)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(boot, [tail, 100 - tail], axis=0)
    interval = {name: (float(lo[i]), float(hi[i])) for i, name in enumerate(PARAMS)}
    notes = []
    if law.alpha >= ALPHA_MAX * 0.999 or law.alpha <= 1e-6:
        notes.append(f"α is at its bound [0, {ALPHA_MAX:g}]: the points do not follow a power law")
    if law.E <= 1e-9:
        notes.append("E is at its bound 0: the points are a straight line in log-log, E is not determined")
    few = sum(len(g) > 1 for g in groups)
    if few < len(groups):
        notes.append(f"{len(groups) - few} size(s) with one seed add no seed noise to the interval")
    return FitResult(law, rss, interval, len(draws), boot, "; ".join(notes) or None)


# ── runs from the registry ───────────────────────────────────────────────────────────────────────────────────────


@dataclass
class RunPoint:
    run_id: str
    seed: int
    loss: float
    params: int  # non-embedding (active) parameters
    tokens: float
    compute: float  # training FLOPs: train FLOPs/token × tokens
    group: tuple  # what the run is grouped by
    group_fields: dict[str, Any]  # the same, as dotted keys → values (for labels)


def non_embedding_params(accounting: dict[str, Any]) -> int | None:
    p = accounting.get("params") if isinstance(accounting, dict) else None
    if not isinstance(p, dict) or not isinstance(p.get("active"), (int, float)) or not isinstance(
            p.get("embedding"), (int, float)):
        return None
    lm_head = (p.get("by_component") or {}).get("lm_head", 0)
    return int(p["active"]) - int(p["embedding"]) - int(lm_head or 0)


def _strip_sizes(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_sizes(v) for k, v in value.items() if k not in SIZE_KEYS}
    if isinstance(value, list):
        return [_strip_sizes(v) for v in value]
    return value


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def run_points(rows: Sequence[Any], by: Sequence[str] = (), metric: str = "val_loss") -> tuple[list[RunPoint], list[str]]:
    """The finished runs among `rows` (registry RunRows) as points, and a line per run left out (and why)."""
    points, skipped = [], []
    for row in rows:
        if row.status != "FINISHED":
            skipped.append(f"{row.id}: {row.status}, not finished")
            continue
        loss = row.summary.get(metric, row.metrics.get(metric))
        n = non_embedding_params(row.accounting)
        train_flops = (row.accounting.get("flops_per_token") or {}).get("train")
        tokens = row.summary.get("tokens")
        if loss is None or not math.isfinite(loss):
            skipped.append(f"{row.id}: no final {metric}")
            continue
        if n is None or n <= 0 or not isinstance(train_flops, (int, float)) or not tokens:
            skipped.append(f"{row.id}: no accounting or token count recorded")
            continue
        fields: dict[str, Any] = {"data": row.data_hash[:12]}  # losses on different data never share a fit
        if by:
            fields.update({key: row.get(key) for key in by})
        else:
            fields.update({f"model.{k}": v for k, v in _flat(_strip_sizes(row.spec.get("model") or {})).items()})
        group = tuple(json.dumps(v, sort_keys=True, default=str) for v in fields.values())
        points.append(RunPoint(row.id, row.seed, float(loss), n, float(tokens), float(train_flops) * float(tokens),
                               group, fields))
    return points, skipped


@dataclass
class SizePoint:
    x: float
    params: int
    tokens: float
    compute: float
    runs: list[RunPoint]

    @property
    def losses(self) -> list[float]:
        return [r.loss for r in self.runs]

    @property
    def mean(self) -> float:
        return float(np.mean(self.losses))


@dataclass
class GroupFit:
    label: str
    fields: dict[str, Any]  # what sets this group apart from the others (all fields when there is one group)
    over: str  # params | compute
    sizes: list[SizePoint]
    result: FitResult

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "label": self.label, "fields": self.fields, "over": self.over, "x": X_NAMES[self.over],
            "fit": {**r.law.as_dict(), "rss": r.rss},
            "interval": ({k: list(v) for k, v in r.interval.items()} if r.interval else None),
            "level": LEVEL, "bootstrap_replicates": r.n_boot, "note": r.note,
            "points": [{"x": s.x, "params": s.params, "tokens": s.tokens, "compute": s.compute, "mean": s.mean,
                        "predicted": float(r.law(s.x)), "n": len(s.runs), "losses": s.losses,
                        "seeds": [p.seed for p in s.runs], "run_ids": [p.run_id for p in s.runs]}
                       for s in self.sizes],
        }


def _label(fields: dict[str, Any], differing: list[str]) -> str:
    """What sets a group apart: the differing keys, less those under a component whose kind differs (a LayerNorm's
    `bias` says nothing beside `norm.kind=layernorm`)."""
    kinds = {k.removesuffix("kind") for k in differing if k.endswith(".kind")}
    shown = [k for k in differing if k.endswith(".kind") or not any(k.startswith(p) for p in kinds)]
    if not shown:
        return "all runs"
    return printable(", ".join(f"{k.removeprefix('model.')}={_show(fields.get(k))}" for k in shown), 80)


def _show(value: Any) -> str:
    """Values as a spec writes them (null, true), not as Python prints them."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def choose_over(points: list[RunPoint], over: str) -> str:
    if over != "auto":
        return over
    return "params" if len({p.tokens for p in points}) == 1 else "compute"


def fit_groups(points: list[RunPoint], over: str = "auto", n_boot: int = 1000, seed: int = 0) -> list[GroupFit]:
    """One fit per group. A group that cannot be fitted (fewer distinct sizes than parameters) refuses the whole
    command with its reason, so that a picture never silently drops an architecture."""
    if over not in OVER:
        raise UserError(f"--over {over!r}: expected one of {', '.join(OVER)}")
    by_group: dict[tuple, list[RunPoint]] = {}
    for p in points:
        by_group.setdefault(p.group, []).append(p)
    keys = list(by_group)
    all_fields = [by_group[k][0].group_fields for k in keys]
    names = list(dict.fromkeys(name for f in all_fields for name in f))
    differing = [n for n in names if len({json.dumps(f.get(n), sort_keys=True, default=str) for f in all_fields}) > 1]
    fits, problems = [], []
    for key, fields in zip(keys, all_fields):
        group = by_group[key]
        label = _label(fields, differing)
        axis = choose_over(group, over)
        sizes: dict[float, list[RunPoint]] = {}
        for p in group:
            x = float(p.params) if axis == "params" else p.compute
            sizes.setdefault(x, []).append(p)
        if axis == "params" and len({p.tokens for p in group}) > 1:
            problems.append(f"{label}: runs trained on different token counts "
                            f"({', '.join(sorted({f'{t:,.0f}' for t in (p.tokens for p in group)}))}): a fit over "
                            "parameters needs one budget; fit over compute (--over compute) or select one budget")
            continue
        ordered = [SizePoint(x, runs[0].params, runs[0].tokens, runs[0].compute, sorted(runs, key=lambda r: r.seed))
                   for x, runs in sorted(sizes.items())]
        try:
            result = fit_with_intervals([s.x for s in ordered], [s.losses for s in ordered], n_boot=n_boot, seed=seed)
        except UserError as e:
            problems.append(f"{label}: {len(group)} finished run(s): {e}")
            continue
        fits.append(GroupFit(label, {n: fields.get(n) for n in (differing or names)}, axis, ordered, result))
    if problems:
        if len(problems) == 1:
            raise UserError(problems[0])
        raise UserError(f"{len(problems)} group(s) cannot be fitted", problems)
    return fits


# ── the picture ──────────────────────────────────────────────────────────────────────────────────────────────────


def plot_fits(title: str, fits: list[GroupFit], path: Path) -> Path:
    """Loss against x on log-log axes: every run (small dots), the seed mean at each size (with its min–max), the
    fitted curve with its bootstrap band, one colour per group, all groups in one picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), constrained_layout=True)
    for g in fits:
        xs = np.array([s.x for s in g.sizes])
        means = np.array([s.mean for s in g.sizes])
        lo = means - np.array([min(s.losses) for s in g.sizes])
        hi = np.array([max(s.losses) for s in g.sizes]) - means
        r = g.result
        ci = (f" [{r.interval['alpha'][0]:.3f}, {r.interval['alpha'][1]:.3f}]" if r.interval else "")
        label = f"{g.label}: α = {r.law.alpha:.3f}{ci}, E = {r.law.E:.3f}"
        container = ax.errorbar(xs, means, yerr=[lo, hi], fmt="o", capsize=3, label=label)
        color = container.lines[0].get_color()
        for s in g.sizes:
            ax.plot([s.x] * len(s.losses), s.losses, ".", color=color, alpha=0.35, markersize=4)
        grid = np.geomspace(xs.min() / 1.5, xs.max() * 1.5, 200)
        ax.plot(grid, r.law(grid), "-", color=color)
        if r.boot is not None and len(r.boot):
            curves = r.boot[:, [0]] + r.boot[:, [1]] * np.power(grid[None, :], -r.boot[:, [2]])
            band_lo, band_hi = np.percentile(curves, [2.5, 97.5], axis=0)
            ax.fill_between(grid, band_lo, band_hi, color=color, alpha=0.15)
    over = {g.over for g in fits}
    ax.set(xscale="log", yscale="log", xlabel=" / ".join(X_NAMES[o] for o in sorted(over)), ylabel="final val loss",
           title=f"{title}: L = E + A·x^(−α), 95% bootstrap band over seeds")
    from matplotlib.ticker import FormatStrFormatter

    for axis_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis_formatter(FormatStrFormatter("%.2f"))  # losses span less than a decade: plain numbers, not 4×10⁰
    ax.grid(alpha=0.3, which="both")
    # below the axes, never over the curves; the tight box keeps the long labels whole
    fig.legend(loc="outside lower center", fontsize=8, ncol=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# Bootstrap replicates for the fit an ablation report shows (`archspec scaling` takes --bootstrap, default 1000).
REPORT_BOOT = 300


def sweep_fits(rows: Sequence[Any], size_keys: Sequence[str], n_boot: int = REPORT_BOOT) -> list[GroupFit] | None:
    """The scaling fit of a sweep that has one, for its report: the sweep varies a size key (SIZE_KEYS, e.g.
    `model.d_model` in a zip) and its finished runs can be fitted (three or more sizes per architecture). None
    otherwise: a sweep over kinds has no size axis, and a fit that cannot be made is `archspec scaling`'s to explain."""
    if not any(k.rpartition(".")[2] in SIZE_KEYS for k in size_keys):
        return None
    points, _ = run_points(rows)
    if len({p.params for p in points}) < N_PARAMS:
        return None
    try:
        return fit_groups(points, n_boot=n_boot)
    except UserError:
        return None


__all__ = ["sweep_fits", "REPORT_BOOT", "PowerLaw", "FitResult", "fit_power_law", "fit_with_intervals", "RunPoint", "run_points", "SizePoint",
           "GroupFit", "fit_groups", "choose_over", "non_embedding_params", "plot_fits", "SIZE_KEYS", "OVER"]
