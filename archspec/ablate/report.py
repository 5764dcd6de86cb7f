"""The ablation verdict: a table (rich), val-loss plots (matplotlib PNG) and a self-contained HTML page (Jinja2).

Built only from `VariantResult`s, which `archspec.ablate.runner.collect` reads back from the registry, so the report
printed at the end of `archspec ablate` and the one rebuilt later by `archspec report` are the same computation on
the same rows.

Noise: each variant's final val loss is a mean over seeds. Its difference to the baseline, Δ = mean_v − mean_b, comes
with a Welch t 95% confidence interval (unequal variances, Welch–Satterthwaite degrees of freedom:
`archspec.ablate.stats`). The verdict is "better" or "worse" only when the interval excludes 0, "inconclusive"
otherwise; with a single seed on either side there is no estimate of noise and it says so ("n/a (1 seed)").
"""

from __future__ import annotations

import base64
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from rich.table import Table

from archspec.ablate.sweep import spec_text
from archspec.ablate.stats import LEVEL, Interval, combination, mean_interval, verdict, welch
from archspec.console import human, number
from archspec.kinds import KindUnit, metric_kinds

# The model-wide stability figures a report draws (archspec.train.metrics: the largest over the layers).
STABILITY_CURVES = {"stability.max_logit": "max attention logit", "stability.act_rms": "residual-stream RMS",
                    "stability.grad_norm": "gradient norm (largest layer)", "stability.update_norm":
                    "update norm (largest layer)"}

CAPTION = (f"val loss: final, mean ± std over seeds; {LEVEL:.0%} CI: Welch t interval of Δ (Welch–Satterthwaite "
           "degrees of freedom); better/worse only when it excludes 0, else inconclusive")


@dataclass
class RunResult:
    run_id: str
    seed: int
    status: str
    final_val_loss: float | None
    tokens_per_s: float | None
    history: list[tuple[int, float]]  # (step, val_loss)
    tokens_per_step: int
    summary: dict[str, float] = field(default_factory=dict)
    note: str | None = None  # the run's latest note (`archspec runs note`), shown beside it in the HTML report
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # stability.* model-wide, per eval
    quant: dict[str, dict[str, float]] = field(default_factory=dict)  # scheme → its quant.<scheme> evaluation's figures


@dataclass
class VariantResult:
    index: int
    label: str  # what differs from the base spec
    diff: dict[str, tuple[Any, Any]]  # dotted key → (baseline value, this value)
    params_total: int
    params_active: int
    flops_train_per_token: int
    kv_cache_bytes_per_token: int
    runs: list[RunResult]
    attention_flops_per_token: int | None = None  # forward QKᵀ and AV per token, at the pattern's key count
    overrides: dict[str, str] = field(default_factory=dict)  # grid/zip key → its value as the spec writes it
    # A matched sweep (`match`/`solve`): {key, value, measure, count, target, residual} of the solved width
    matched: dict[str, Any] | None = None
    # An lr_sweep: each rate's pilot run [{lr, status, val_loss, run_id}] and the best rate (None: not decided yet);
    # `runs` are then the runs at the best rate
    rates: list[dict[str, Any]] | None = None
    best_lr: float | None = None

    @property
    def finals(self) -> list[float]:
        return [r.final_val_loss for r in self.runs if r.status == "FINISHED" and r.final_val_loss is not None]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.finals) if self.finals else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.finals) if len(self.finals) > 1 else (0.0 if self.finals else None)

    @property
    def tokens_per_s(self) -> float | None:
        rates = [r.tokens_per_s for r in self.runs if r.tokens_per_s]
        return statistics.fmean(rates) if rates else None

    def probe_stats(self) -> dict[str, float]:
        """Mean over finished seeds of the capability-task accuracies (`probe.accuracy`, `probe.accuracy.d<d>`: a run
        trained on an mqar or passkey corpus records them at each evaluation; archspec.train.tasks)."""
        done = [r for r in self.runs if r.status == "FINISHED"]
        keys = sorted({k for r in done for k in r.summary if k.startswith("probe.accuracy")},
                      key=lambda k: (k != "probe.accuracy", int(k.rpartition(".d")[2]) if ".d" in k else 0, k))
        return {k: statistics.fmean([r.summary[k] for r in done if k in r.summary]) for k in keys}

    def quant_stats(self) -> dict[str, dict[str, Any]]:
        """Per scheme a sweep quantized at (`quantize:`): the val-loss delta (quantized − trained) over the finished
        seeds with its t interval, and the mean size ratio; the trained val loss of the same runs with its interval."""
        done = [r for r in self.runs if r.status == "FINISHED" and r.final_val_loss is not None]
        schemes = list(dict.fromkeys(s for r in done for s in r.quant))
        out = {}
        for scheme in schemes:
            runs = [r for r in done if scheme in r.quant]
            out[scheme] = {"n": len(runs), "delta": mean_interval([r.quant[scheme]["val_loss_delta"] for r in runs]),
                           "trained": mean_interval([r.final_val_loss for r in runs]),
                           "size_ratio": statistics.fmean(r.quant[scheme]["size_ratio"] for r in runs)}
        return out

    def stability_stats(self) -> dict[str, float]:
        """Mean over finished seeds of the model-wide stability figures at the end (train.stability runs)."""
        done = [r for r in self.runs if r.status == "FINISHED"]
        keys = sorted({k for r in done for k in r.summary if k in STABILITY_CURVES or k == "stability.loss_spikes"})
        return {k: statistics.fmean([r.summary[k] for r in done if k in r.summary]) for k in keys}

    def kind_stats(self, kind: type[KindUnit]) -> dict[str, float]:
        """Mean over seeds of the summary metrics a kind reports (keys under its `metric_prefix`, e.g. an MoE's load
        statistics; archspec.kinds.base)."""
        keys = sorted({k for r in self.runs for k in r.summary if k.startswith(kind.metric_prefix)})
        return {k: statistics.fmean([r.summary[k] for r in self.runs if k in r.summary]) for k in keys}


@dataclass
class Comparison:
    """A variant against the baseline: Δ = mean_v − mean_b with its Welch interval (None: no runs on a side)."""

    interval: Interval | None

    @property
    def delta(self) -> float | None:
        return self.interval.estimate if self.interval is not None else None

    @property
    def se(self) -> float | None:
        return self.interval.se if self.interval is not None else None

    @property
    def verdict(self) -> str:
        return verdict(self.interval)


def compare(variant: VariantResult, baseline: VariantResult) -> Comparison:
    return Comparison(welch(variant.finals, baseline.finals))


def _mean_std(v: VariantResult) -> str:
    if v.mean is None:
        return "-"
    return f"{v.mean:.4f} ± {v.std:.4f}" if len(v.finals) > 1 else f"{v.mean:.4f}"


# Runs' throughput compares only when the machine was about as busy for each: their 1-minute load averages (the
# `load_average` summary, archspec.train.loop) within a core's worth, or a quarter of the cores, of each other.
def _load_tolerance() -> float:
    import os

    return max(1.0, 0.25 * (os.cpu_count() or 1))


def load_differed(variants: list[VariantResult]) -> str | None:
    """Why the tok/s column does not compare (None when it does): the load averages the runs were measured under
    spread wider than the tolerance. Runs recorded before the load was (no `load_average`) are not judged."""
    return loads_differed([r.summary for v in variants for r in v.runs if r.tokens_per_s])


def loads_differed(summaries: list[dict]) -> str | None:
    """The one rule for any comparison of throughput (a report, `runs compare`): why the runs with these summaries
    were not measured alike, or None."""
    loads = [s["load_average"] for s in summaries if isinstance(s.get("load_average"), (int, float))]
    if len(loads) < 2 or max(loads) - min(loads) <= _load_tolerance():
        return None
    return (f"load differed: the runs were measured at machine load averages {min(loads):.1f} to {max(loads):.1f}; "
            "tok/s compares only between runs measured alike (rerun them on a quiet machine, or one at a time)")


def _variant_load(v: VariantResult) -> float | None:
    loads = [r.summary["load_average"] for r in v.runs
             if r.tokens_per_s and isinstance(r.summary.get("load_average"), (int, float))]
    return statistics.fmean(loads) if loads else None


def table_rows(variants: list[VariantResult], baseline_index: int) -> list[dict[str, str]]:
    """The table's cells as strings: one source for the rich table, the HTML table and tests."""
    baseline = next((v for v in variants if v.index == baseline_index), None)
    flag_load = load_differed(variants) is not None
    show_kv = len({v.kv_cache_bytes_per_token for v in variants}) > 1
    show_attention = len({v.attention_flops_per_token for v in variants}) > 1  # e.g. attention patterns
    kinds = metric_kinds()
    rows = []
    for v in variants:
        c = compare(v, baseline) if baseline is not None else Comparison(None)
        finals = v.finals
        row = {
            "variant": f"v{v.index}" + (" (baseline)" if v.index == baseline_index else ""),
            "differs": v.label if v.index != baseline_index else (v.label or "base"),
            "params": human(v.params_total),
            "active": human(v.params_active),
            "train FLOPs/tok": human(v.flops_train_per_token),
            "tok/s": (number(v.tokens_per_s) + (f" (load {_variant_load(v):.1f}: differed)"
                                                 if flag_load and _variant_load(v) is not None else "")
                      if v.tokens_per_s else "-"),
            "val loss": _mean_std(v) + f" (n={len(finals)})",
            "Δ vs baseline": "-" if v.index == baseline_index or c.delta is None else f"{c.delta:+.4f}",
            "95% CI": "-" if v.index == baseline_index or c.interval is None else c.interval.text(),
            "verdict": "baseline" if v.index == baseline_index else (
                c.verdict if baseline is not None and baseline.finals else "no baseline runs"),
        }
        if v.rates is not None:
            done = sum(p["status"] in ("FINISHED", "FAILED") for p in v.rates)
            row["best lr"] = (f"{v.best_lr:g}" if v.best_lr is not None else
                              f"pilots {done}/{len(v.rates)}" if done < len(v.rates) else "every pilot failed")
        if v.matched is not None:
            m = v.matched
            row["matched"] = (f"{m['key'].rpartition('.')[2]}={m['value']} " + (
                f"(target {m['measure']})" if v.index == baseline_index else f"({m['residual']:+.2%} {m['measure']})"))
        if show_attention:
            a = v.attention_flops_per_token
            row["attn FLOPs/tok"] = human(a) if a is not None else "-"
        if show_kv:
            row["KV B/tok"] = f"{v.kv_cache_bytes_per_token:,}"
        stab = v.stability_stats()
        if stab:  # train.stability runs: the final model-wide figures, mean over seeds
            row["stability"] = ", ".join(
                f"{label} {stab[key]:{fmt}}" for key, label, fmt in (
                    ("stability.max_logit", "logit", ".1f"), ("stability.act_rms", "rms", ".2f"),
                    ("stability.loss_spikes", "spikes", ".1f")) if key in stab)
        probes = v.probe_stats()
        if probes:  # exact match on the answer positions, mean over seeds; passkey: per distance
            buckets = ", ".join(f"{k.removeprefix('probe.accuracy.')} {x:.2f}" for k, x in probes.items()
                                if k != "probe.accuracy")
            row["answer acc"] = f"{probes.get('probe.accuracy', float('nan')):.3f}" + (f" ({buckets})" if buckets else "")
        quant = v.quant_stats()
        if quant:  # the sweep's `quantize:` schemes: the trained loss's interval, then each scheme's Δ beside it
            row["trained 95% CI"] = _mean_ci(next(iter(quant.values()))["trained"])
            for scheme, q in quant.items():
                row[f"{scheme} Δ val loss [95% CI]"] = _delta_text(q["delta"]) + f" ({q['size_ratio']:.2f}× smaller)"
        for kind in kinds:  # the kinds that report metrics: a column each, where some variant has them
            stats = v.kind_stats(kind)
            if stats:
                row[kind.metric_column] = kind.report_cell(stats, number)
        rows.append(row)
    quant_columns = [c for r in rows for c in r if c == "trained 95% CI" or c.endswith(" Δ val loss [95% CI]")]
    for column in ["best lr", "matched", "stability", "answer acc", *dict.fromkeys(quant_columns),
                   *(kind.metric_column for kind in kinds)]:
        if any(column in r for r in rows):
            for r in rows:
                r.setdefault(column, "-")
    return rows


def _delta_text(i: Interval | None) -> str:
    """A difference with its interval, `+0.0123 [+0.0100, +0.0146]`; the estimate alone with one seed."""
    return "-" if i is None else f"{i.estimate:+.4f}" + (f" {i.text()}" if i.known else "")


def _quant_numbers(v: "VariantResult") -> dict[str, Any]:
    return {scheme: {"n": q["n"], "size_ratio": q["size_ratio"],
                     "val_loss_delta": q["delta"].as_dict() if q["delta"] else None,
                     "trained_val_loss": q["trained"].as_dict() if q["trained"] else None}
            for scheme, q in v.quant_stats().items()}


def variant_numbers(variants: list[VariantResult], baseline_index: int) -> list[dict[str, Any]]:
    """The table's figures as numbers (for --json): what a script compares against the registry."""
    baseline = next((v for v in variants if v.index == baseline_index), None)
    out = []
    for v in variants:
        c = compare(v, baseline) if baseline is not None and v.index != baseline_index else Comparison(None)
        ci = c.interval
        out.append({
            "index": v.index, "label": v.label, "params_total": v.params_total, "params_active": v.params_active,
            "flops_train_per_token": v.flops_train_per_token, "kv_cache_bytes_per_token": v.kv_cache_bytes_per_token,
            "attention_flops_per_token": v.attention_flops_per_token,
            "tokens_per_s": v.tokens_per_s, "n": len(v.finals), "final_val_losses": v.finals,
            "mean": v.mean, "std": v.std if len(v.finals) > 1 else None, "delta": c.delta, "se": c.se,
            "dof": ci.dof if ci else None, "ci_low": ci.low if ci else None, "ci_high": ci.high if ci else None,
            "ci_level": LEVEL,
            "verdict": "baseline" if v.index == baseline_index else (
                c.verdict if baseline is not None and baseline.finals else "no baseline runs"),
            "runs": [{"run_id": r.run_id, "seed": r.seed, "status": r.status} for r in v.runs],
            "probe": v.probe_stats(),  # capability tasks: mean accuracy on the answer positions (and per distance)
            "matched": v.matched,  # the solved width of a matched sweep, or None
            "rates": v.rates, "best_lr": v.best_lr,  # an lr_sweep: each rate's pilot, and the best rate
            "stability": v.stability_stats(),  # train.stability runs: final model-wide figures, mean over seeds
            "quant": _quant_numbers(v),  # a sweep's `quantize:`: per scheme Δ val loss over seeds with its interval
        })
    return out


# ── main effects of a multi-factor grid ──────────────────────────────────────────────────────────────────────────


_KEY_START = re.compile(r", (?=[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*=)")


def label_overrides(label: str) -> dict[str, str]:
    """A variant's label (`k=v, k2=v2`, what a sweep membership records) back to its overrides: how a report built
    from the registry alone, without the sweep file, finds the grid's factors. Values hold no `, key=`."""
    if not label or label == "base":
        return {}
    out = {}
    for part in _KEY_START.split(label):
        key, sep, value = part.partition("=")
        if not sep:
            return {}
        out[key] = value
    return out


@dataclass
class Factor:
    keys: list[str]  # the grid key, or the zip keys varied together
    levels: list[str]  # in the order of the variants
    level_of: dict[int, str]  # variant index → its level

    @property
    def name(self) -> str:
        return "+".join(self.keys)


def grid_factors(variants: list[VariantResult]) -> list[Factor]:
    """The factors of the sweep's grid: each override key whose value varies, keys that co-vary merged into one
    factor. Two keys are separate factors only when they are crossed (every pair of their levels occurs, as in a
    grid's product); keys of a zip vary together (`n_layers` 2, 2, 3, 4 beside `d_model` 32, 48, 64, 96: a coarser
    partition, not a second factor), so they are one factor, named `key1+key2`."""
    keys = list(dict.fromkeys(k for v in variants for k in v.overrides))
    if not keys or any(set(v.overrides) != set(keys) for v in variants):
        return []
    groups: list[list[str]] = []
    for key in keys:
        if len({v.overrides[key] for v in variants}) >= 2:
            groups.append([key])

    def levels(group: list[str]) -> list[tuple[str, ...]]:
        return [tuple(v.overrides[k] for k in group) for v in variants]

    def crossed(a: list[str], b: list[str]) -> bool:
        la, lb = levels(a), levels(b)
        return len(set(zip(la, lb))) == len(set(la)) * len(set(lb))

    merged = True
    while merged:  # merge any two groups that are not crossed, until every pair is
        merged = False
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                if not crossed(groups[i], groups[j]):
                    groups[i] = groups[i] + groups.pop(j)
                    merged = True
                    break
            if merged:
                break
    factors = []
    for group in groups:
        level_of = {v.index: ", ".join(v.overrides[k] for k in group) if len(group) > 1 else v.overrides[group[0]]
                    for v in variants}
        factors.append(Factor(group, list(dict.fromkeys(level_of[v.index] for v in variants)), level_of))
    return factors


def _mean_ci(i: Interval | None) -> str:
    if i is None:
        return "-"
    return f"{i.estimate:.4f}" + (f" [{i.low:.4f}, {i.high:.4f}]" if i.known else "")


def main_effects(variants: list[VariantResult], baseline_index: int) -> list[dict[str, Any]]:
    """Per factor of a multi-factor grid (two or more factors), per level: the marginal mean of the final val loss
    (the mean of the level's cell means, averaging over the other factors) and its difference to the baseline
    variant's level, each with a Welch–Satterthwaite t interval over the cells' seeds (`stats.combination`); the
    verdict as for the cells. Empty for a one-factor sweep (the cell table is its main effect)."""
    factors = grid_factors(variants)
    base = next((v for v in variants if v.index == baseline_index), None)
    if len(factors) < 2 or base is None:
        return []
    out = []
    for f in factors:
        cells = {level: [v for v in variants if f.level_of[v.index] == level] for level in f.levels}
        ref = f.level_of[base.index]

        def groups(level: str, sign: float = 1.0) -> list[tuple[float, list[float]]]:
            return [(sign / len(cells[level]), v.finals) for v in cells[level]]

        for level in f.levels:
            marginal = combination(groups(level))
            effect = None if level == ref else combination(groups(level) + groups(ref, -1.0))
            out.append({
                "factor": f.name, "level": level, "cells": len(cells[level]),
                "n": sum(len(v.finals) for v in cells[level]),
                "mean": marginal.estimate if marginal else None,
                "mean_low": marginal.low if marginal else None, "mean_high": marginal.high if marginal else None,
                "delta": effect.estimate if effect else None, "se": effect.se if effect else None,
                "dof": effect.dof if effect else None,
                "ci_low": effect.low if effect else None, "ci_high": effect.high if effect else None,
                "ci_level": LEVEL, "reference": ref,
                "verdict": "reference" if level == ref else verdict(effect),
                "_marginal": marginal, "_effect": effect,
            })
    return out


def effect_rows(effects: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The main-effects table's cells as strings (rich table, HTML)."""
    return [{
        "factor": e["factor"], "level": e["level"] + (" (baseline's)" if e["verdict"] == "reference" else ""),
        "cells": str(e["cells"]), "marginal val loss [95% CI]": _mean_ci(e["_marginal"]),
        "Δ vs baseline's level": "-" if e["_effect"] is None else f"{e['delta']:+.4f}",
        "95% CI": "-" if e["_effect"] is None else e["_effect"].text(),
        "verdict": "baseline's level" if e["verdict"] == "reference" else e["verdict"],
    } for e in effects]


def effect_numbers(effects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if not k.startswith("_")} for e in effects]


EFFECTS_CAPTION = ("marginal val loss: the mean of the level's cell means (over the other factors' levels); "
                   f"Δ and its {LEVEL:.0%} Welch–Satterthwaite t interval against the baseline variant's level")


def rich_table(title: str, rows: list[dict[str, str]], caption: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for col in rows[0] if rows else []:
        table.add_column(col, justify="left" if col in ("variant", "differs", "verdict", "factor", "level") else "right",
                         overflow="fold")
    for r in rows:
        table.add_row(*r.values())
    table.caption = caption or CAPTION
    table.caption_justify = "left"
    return table


def verdict_text(v: VariantResult, baseline: VariantResult | None) -> str:
    """A variant's verdict as the figure states it: `baseline`, or Δ with its 95% CI and the verdict."""
    if baseline is None or v.index == baseline.index:
        return "baseline"
    c = compare(v, baseline)
    if c.interval is None:
        return "no runs" if not v.finals else "no baseline runs"
    ci = f" {c.interval.text()}" if c.interval.known else ""
    return f"Δ {c.delta:+.4f}{ci}: {c.verdict}"


def report_figure(title: str, variants: list[VariantResult], baseline_index: int | None = None):
    """The report's figure (matplotlib): val loss vs step and vs cumulative train FLOPs (mean line, min–max band over
    seeds), and a third panel of the final val loss per variant (each seed, the mean and its 95% t interval) on a
    y-range set by the final values' spread, so the gap the verdict is about can be seen. Each variant's legend
    label carries its verdict against the baseline (Δ with its Welch interval); the legend sits below the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from archspec.ablate.stats import mean_interval

    baseline = next((v for v in variants if v.index == baseline_index), None)
    fig, (ax_step, ax_flops, ax_final) = plt.subplots(1, 3, figsize=(15, 5.2), constrained_layout=True,
                                                      gridspec_kw={"width_ratios": [1.2, 1.2, 0.8]})
    handles, labels, finals_shown = [], [], []
    for pos, v in enumerate(variants):
        curves = [dict(r.history) for r in v.runs if r.history]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        label = f"v{v.index}: {v.label}"[:60] + f" — {verdict_text(v, baseline)}"
        color = f"C{pos % 10}"
        if steps:
            vals = [[c[s] for c in curves] for s in steps]
            mean = [statistics.fmean(x) for x in vals]
            lo, hi = [min(x) for x in vals], [max(x) for x in vals]
            (line,) = ax_step.plot(steps, mean, marker="o", markersize=3, color=color)
            ax_step.fill_between(steps, lo, hi, alpha=0.2, color=color)
            tokens_per_step = v.runs[0].tokens_per_step
            flops = [s * tokens_per_step * v.flops_train_per_token for s in steps]
            ax_flops.plot(flops, mean, color=color, marker="o", markersize=3)
            ax_flops.fill_between(flops, lo, hi, alpha=0.2, color=color)
            handles.append(line)
            labels.append(label)
        finals = v.finals
        if finals:
            ax_final.plot([pos] * len(finals), finals, ".", color=color, alpha=0.5, markersize=6)
            m = mean_interval(finals)
            err = [[v.mean - m.low], [m.high - v.mean]] if m is not None and m.known else None
            ax_final.errorbar([pos], [v.mean], yerr=err, fmt="s", color=color, capsize=4, markersize=5)
            finals_shown += finals + ([m.low, m.high] if m is not None and m.known else [])
            if not steps:
                handles.append(ax_final.lines[-1])
                labels.append(label)
    ax_step.set(xlabel="step", ylabel="val loss", title=f"{title}: val loss (mean, min–max over seeds)")
    ax_flops.set(xlabel="train FLOPs", ylabel="val loss", title="val loss vs compute", xscale="log")
    ax_final.set(ylabel="final val loss", title="final val loss (seeds, mean, 95% CI)",
                 xticks=list(range(len(variants))), xticklabels=[f"v{v.index}" for v in variants])
    if finals_shown:  # the y-range of the final values' spread: the gap is the point of the panel
        lo, hi = min(finals_shown), max(finals_shown)
        pad = max(hi - lo, 1e-3 * max(abs(hi), 1.0)) * 0.25
        ax_final.set_ylim(lo - pad, hi + pad)
        ax_final.set_xlim(-0.6, len(variants) - 0.4)
    for ax in (ax_step, ax_flops, ax_final):
        ax.grid(alpha=0.3)
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=1 if len(handles) > 4 else 2, fontsize=8,
                   title="variant — Δ final val loss vs baseline [95% Welch CI]: verdict", title_fontsize=8)
    return fig


def rate_figure(title: str, variants: list[VariantResult], pilot: str = "the pilot seed"):
    """An lr_sweep's rate curves: each variant's pilot final val loss against the rate (log scale), its best rate
    marked; None when the sweep swept no rates."""
    swept = [v for v in variants if v.rates]
    if not swept:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2), constrained_layout=True)
    for pos, v in enumerate(variants):
        if not v.rates:
            continue
        points = [(p["lr"], p["val_loss"]) for p in v.rates if p["status"] == "FINISHED" and p["val_loss"] is not None]
        color = f"C{pos % 10}"
        if points:
            ax.plot(*zip(*points), marker="o", color=color, label=f"v{v.index}: {v.label}"[:50])
        best = next((y for x, y in points if x == v.best_lr), None)
        if best is not None:
            ax.plot([v.best_lr], [best], marker="*", markersize=14, color=color)
        for p in v.rates:
            if p["status"] == "FAILED":
                ax.axvline(p["lr"], color=color, alpha=0.3, linestyle=":")
    ax.set(xscale="log", xlabel="peak learning rate (train.lr)", ylabel=f"final val loss ({pilot})",
           title=f"{title}: val loss against the rate (★ best; dotted: the pilot failed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def stability_figure(title: str, variants: list[VariantResult]):
    """The stability curves (train.stability runs): each model-wide figure against the step, mean over seeds per
    variant; None when no run recorded them."""
    keys = [k for k in STABILITY_CURVES if any(k in r.curves for v in variants for r in v.runs)]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.8), constrained_layout=True, squeeze=False)
    for ax, key in zip(axes[0], keys):
        for pos, v in enumerate(variants):
            curves = [dict(r.curves[key]) for r in v.runs if r.curves.get(key)]
            steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if steps:
                ax.plot(steps, [statistics.fmean(c[s] for c in curves) for s in steps], marker="o", markersize=3,
                        color=f"C{pos % 10}", label=f"v{v.index}")
        ax.set(xlabel="step", title=STABILITY_CURVES[key])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{title}: stability at each evaluation (mean over seeds)")
    return fig


def figure_texts(fig) -> list[str]:
    """Every text a figure draws (titles, labels, legend entries): what a test reads instead of pixels."""
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


def plot_png(title: str, variants: list[VariantResult], path: Path, baseline_index: int | None = None) -> Path:
    """The report's figure (`report_figure`) as a PNG."""
    import matplotlib.pyplot as plt

    fig = report_figure(title, variants, baseline_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


_HTML = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
    autoescape=jinja2.select_autoescape(["html", "j2"]),  # spec values and labels are user text: escape them
    undefined=jinja2.StrictUndefined,
)
_HTML.filters["spec"] = spec_text  # values as a spec writes them (null, true), not Python's None/True


def scaling_section(fits, png: Path) -> dict[str, Any]:
    """The scaling fit (archspec.ablate.scaling.GroupFit list) as the HTML report shows it: a row per group and
    its picture."""
    from archspec.ablate.scaling import X_NAMES

    def ci(r, name: str) -> str:
        return f"[{number(r.interval[name][0])}, {number(r.interval[name][1])}]" if r.interval else "-"

    rows = [{"group": g.label, "x": X_NAMES[g.over], "sizes": str(len(g.sizes)),
             "runs": str(sum(len(s.runs) for s in g.sizes)), "E": number(g.result.law.E), "E 95% CI": ci(g.result, "E"),
             "A": number(g.result.law.A), "A 95% CI": ci(g.result, "A"), "α": f"{g.result.law.alpha:.4f}",
             "α 95% CI": ci(g.result, "alpha")} for g in fits]
    n_boot = max((g.result.n_boot for g in fits), default=0)
    return {"rows": rows, "image": base64.b64encode(png.read_bytes()).decode(),
            "notes": [g.result.note for g in fits if g.result.note],
            "caption": f"L = E + A·x^(−α), least squares on the seed means at each size; intervals: 95% percentile "
                       f"bootstrap over seeds ({n_boot} replicates); `archspec scaling` refits with more"}


def render_html(title: str, rows: list[dict[str, str]], png: Path, variants: list[VariantResult],
                meta: dict[str, Any], effects: list[dict[str, str]] | None = None,
                scaling: dict[str, Any] | None = None, figures: list[dict[str, str]] | None = None) -> str:
    """figures: more pictures after the curves, each {title, caption, png (a path)}."""
    image = base64.b64encode(png.read_bytes()).decode()
    shown = [{"title": f["title"], "caption": f["caption"],
              "image": base64.b64encode(Path(f["png"]).read_bytes()).decode()} for f in figures or []]
    return _HTML.get_template("report.html.j2").render(title=title, rows=rows, image=image, variants=variants,
                                                       meta=meta, caption=CAPTION, effects=effects or [],
                                                       effects_caption=EFFECTS_CAPTION, scaling=scaling,
                                                       figures=shown)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write_report(title: str, variants: list[VariantResult], baseline_index: int, out_dir: Path,
                 meta: dict[str, Any], fits=None) -> tuple[list[dict[str, str]], Path, Path]:
    """Table rows, the PNG and the HTML; `fits` (archspec.ablate.scaling.sweep_fits), when the sweep has a scaling
    fit, adds it to the HTML with its own picture (`<title>-scaling.png`). A report is shared: its header and the
    whole HTML pass archspec.errors.redact (a registry URL's password never reaches it)."""
    from archspec.errors import redact

    meta = {k: redact(v) if isinstance(v, str) else v for k, v in meta.items()}
    rows = table_rows(variants, baseline_index)
    png = plot_png(title, variants, out_dir / f"{title}.png", baseline_index)
    html = out_dir / f"{title}.html"
    effects = effect_rows(main_effects(variants, baseline_index))
    scaling = None
    if fits:
        from archspec.ablate.scaling import plot_fits

        scaling = scaling_section(fits, plot_fits(title, fits, out_dir / f"{title}-scaling.png"))
    figures = []
    if (fig := rate_figure(title, variants)) is not None:
        figures.append({"title": "Learning rate", "png": _save(fig, out_dir / f"{title}-lr.png"),
                        "caption": meta.get("lr rule", "each variant at its own best rate")})
    if (fig := stability_figure(title, variants)) is not None:
        figures.append({"title": "Stability", "png": _save(fig, out_dir / f"{title}-stability.png"),
                        "caption": "the largest over the layers of each figure at every evaluation (train.stability;"
                                   " archspec.train.metrics): max attention logit q·k/√d, RMS of a block's output, "
                                   "gradient and update L2 norms of the step before the evaluation"})
    html.write_text(redact(render_html(title, rows, png, variants, meta, effects, scaling, figures)), encoding="utf-8")
    return rows, png, html
