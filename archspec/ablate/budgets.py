"""A sweep's budgets: one sweep file run with other options is another experiment, found and reported apart.

A sweep is its file plus the options `archspec ablate` took: `--steps N` (the budget) and `--set K=V` (the base spec).
`--seeds` only chooses seeds (a budget holds every seed it has run at), and options that change only how runs are
observed (`--eval-tokens`, `--set train.eval_interval=...`) are no part of it: they change no run key.

Nothing new is stored for this: a budget is found from the runs recorded as members of the sweep's name. With the
sweep file (`file_budgets`): the file as written, then the file at each `--steps` its runs were trained at, then, for
runs still unmatched, the file with the `--set` overrides read off the difference between such a run's spec and its
variant's; each budget's runs are those whose model and learning recipe are one of its variants' (the way
archspec.ablate.runner.collect matches them). By name alone (`name_budgets`, the UI): the runs grouped by the sweep
hash their membership records, which names the variants' models and learning recipes (not the seeds) for runs
recorded since budgets were told apart; older runs are grouped by theirs, which also held the seeds.

`archspec ablate --status`, `archspec report` and the UI list the same budgets; a budget's report goes to
`reports/<sweep>/` (the file as written) or `reports/<sweep>/<slug>/` (`budget_slug`), so no budget's report
overwrites another's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

from archspec.errors import UserError, printable
from archspec.train.logger import recipe_hash

# `--set` keys that change only how a run is observed: not part of a budget (archspec.train.logger.NOT_IDENTITY)
_OBSERVED_PREFIX = "train."



def variant_identity(model_hash: str, recipe: Mapping[str, Any]) -> tuple[str, str]:
    """What makes a run one of a variant's seeds: its model and learning recipe (the seed is not in the recipe)."""
    return model_hash, recipe_hash(recipe)

def identity_overrides(overrides: Sequence[str]) -> tuple[str, ...]:
    """The `--set` overrides that make another experiment: those of observation-only recipe keys dropped, the rest
    spelled as given, sorted (the order of --set options does not make another sweep)."""
    from archspec.train.logger import NOT_IDENTITY

    kept = []
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key.startswith(_OBSERVED_PREFIX) and key[len(_OBSERVED_PREFIX):].split(".")[0] in NOT_IDENTITY - {"seed"}:
            continue
        kept.append(item.strip())
    return tuple(sorted(kept))


def own_steps(sweep_file, steps: int | None) -> int | None:
    """`--steps N` as a budget: None when it is the file's own (`budget: {steps: N}`)."""
    budget = getattr(sweep_file, "budget", None)
    if steps is not None and budget is not None and budget.kind == "steps" and budget.steps == steps:
        return None
    return steps


def budget_slug(steps: int | None, overrides: Sequence[str] = ()) -> str:
    """The report sub-folder of a budget: "" for the file as written, else `steps-60`, `set-1a2b3c4d` or both."""
    parts = [f"steps-{int(steps)}"] if steps is not None else []
    kept = identity_overrides(overrides)
    if kept:
        parts.append("set-" + hashlib.sha256("\n".join(kept).encode()).hexdigest()[:8])
    return "_".join(parts)


def report_dir(sweep_name: str, steps: int | None = None, overrides: Sequence[str] = ()) -> Path:
    slug = budget_slug(steps, overrides)
    return Path("reports") / sweep_name / slug if slug else Path("reports") / sweep_name


def options_text(steps: int | None, overrides: Sequence[str] = ()) -> str:
    """The options that select a budget, as typed after `archspec ablate SWEEP` (empty for the file as written)."""
    import shlex

    words = ([f"--steps {int(steps)}"] if steps is not None else []) + [
        f"--set {shlex.quote(o)}" for o in identity_overrides(overrides)]
    return " ".join(words)


@dataclass
class SweepBudget:
    """One budget of a sweep and the runs recorded at it."""

    steps: int | None  # --steps; None: the file's own budget (or, by name, more than one steps value)
    overrides: tuple[str, ...] = ()  # --set, identity-changing only
    sweep: Any = None  # archspec.ablate.sweep.Sweep loaded with these options; None when found by name only
    run_ids: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    latest: datetime | None = None
    label: str = ""  # by name: what tells it apart (steps, seeds, hash prefix)
    key: str = ""  # by name: the sweep hash the runs share (`?budget=` in the UI)

    @property
    def options(self) -> str:
        return options_text(self.steps, self.overrides)

    @property
    def slug(self) -> str:
        return budget_slug(self.steps, self.overrides)

    @property
    def describe(self) -> str:
        return self.options or self.label or "as written"


def _summarise(budget: SweepBudget, rows: list) -> SweepBudget:
    budget.run_ids = [r.id for r in rows]
    budget.seeds = sorted({r.seed for r in rows})
    for r in rows:
        budget.statuses[r.status] = budget.statuses.get(r.status, 0) + 1
    budget.latest = max((r.created for r in rows), default=None)
    return budget


def _member_rows(registry, name: str) -> list:
    from archspec.registry.query.parse import text_literal

    try:
        return registry.runs(where=f"sweep = {text_literal(name)}", sort="created")
    except UserError:  # a name the filter language cannot hold has no runs
        return []


def _wanted(sweep) -> set[tuple[str, str]]:
    from archspec.spec import model_hash
    from archspec.train.build import run_recipe

    return {variant_identity(model_hash(j.spec), run_recipe(j.spec)) for j in sweep.all_jobs()}


def _derived_overrides(row, variant_spec, rates: bool = False) -> tuple[str, ...] | None:
    """The `--set` overrides that turn `variant_spec` into the spec `row` was trained from: the dotted keys whose
    values differ, but those the budget or the observation sets (steps, warm-up, evaluation, seed, name)."""
    from archspec.ablate.sweep import spec_diff, spec_text
    from archspec.spec import parse_spec

    try:
        run_spec = parse_spec(row.spec)
    except Exception:  # a spec of an older release that no longer loads: no budget of the current file
        return None
    skip = {"train.steps", "train.warmup_steps", "train.seed", "train.eval_interval", "train.eval_tokens",
            "train.stability", *(["train.lr"] if rates else [])}  # an lr_sweep's rate is its own, not a --set
    diff = {k: b for k, (a, b) in spec_diff(variant_spec, run_spec).items() if k not in skip}
    return tuple(sorted(f"{k}={spec_text(v)}" for k, v in diff.items()))


def file_budgets(registry, path: str | Path) -> list[SweepBudget]:
    """Every budget the sweep file at `path` has runs at, the file as written first, then by the latest run. Runs
    recorded under the sweep's name that no budget of the current file holds (the file was edited since) come last,
    as one budget with no options (`sweep` None)."""
    from archspec.ablate.sweep import load_sweep

    as_written = load_sweep(path)
    rows = _member_rows(registry, as_written.name)
    if not rows:
        return []
    left = {r.id: r for r in rows}
    out: list[SweepBudget] = []

    def take(sweep, steps, overrides) -> None:
        wanted = _wanted(sweep)
        matched = [r for r in left.values() if variant_identity(r.model_hash, r.recipe) in wanted]
        if matched:
            for r in matched:
                left.pop(r.id)
            out.append(_summarise(SweepBudget(steps, tuple(overrides), sweep), matched))

    take(as_written, None, ())
    for steps in sorted({int(r.recipe.get("steps") or 0) for r in rows} - {0}):
        if not left:
            break
        steps_opt = own_steps(as_written.file, steps)
        if steps_opt is None:
            continue
        try:
            take(load_sweep(path, steps=steps), steps, ())
        except UserError:
            continue
    # runs still unmatched: trained with --set; read the overrides off one run per (steps, variant)
    tried: set[tuple[int | None, tuple[str, ...]]] = set()
    for row in list(left.values()):
        if row.id not in left:
            continue
        membership = row.memberships.get(as_written.name)
        steps = own_steps(as_written.file, int(row.recipe.get("steps") or 0) or None)
        try:
            at_steps = load_sweep(path, steps=steps) if steps is not None else as_written
        except UserError:
            continue
        index = membership.variant if membership is not None else 0
        if not 0 <= index < len(at_steps.variants):
            continue
        overrides = _derived_overrides(row, at_steps.variants[index].spec, bool(at_steps.rates))
        if not overrides or (steps, overrides) in tried:
            continue
        tried.add((steps, overrides))
        try:
            take(load_sweep(path, steps=steps, overrides=overrides), steps, overrides)
        except UserError:
            continue
    written = [b for b in out if b.steps is None and not b.overrides]
    others = sorted((b for b in out if b.steps is not None or b.overrides),
                    key=lambda b: b.latest or datetime.min, reverse=True)
    out = written + others
    if left:
        out.append(_summarise(SweepBudget(None, (), None, label="runs of an earlier definition of the file"),
                              list(left.values())))
    return out


def name_budgets(registry, name: str) -> list[SweepBudget]:
    """The budgets of the sweep called `name`, from its runs alone (no file): grouped by the sweep hash their
    memberships record, the latest first."""
    groups: dict[str, list] = {}
    for row in _member_rows(registry, name):
        membership = row.memberships.get(name)
        groups.setdefault(membership.sweep_hash if membership is not None else "", []).append(row)
    out = []
    for key, rows in groups.items():
        steps = sorted({int(r.recipe.get("steps") or 0) for r in rows})
        budget = _summarise(SweepBudget(steps[0] if len(steps) == 1 else None, key=key), rows)
        budget.label = (f"steps {', '.join(map(str, steps))} · seeds {', '.join(map(str, budget.seeds))}"
                        + (f" · {key[:8]}" if key else ""))
        out.append(budget)
    out.sort(key=lambda b: b.latest or datetime.min, reverse=True)
    return out


def budgets_note(name: str, budgets: list[SweepBudget], shown: SweepBudget, sweep_arg: str) -> str | None:
    """What a report says when the sweep has run at more than one budget: which one it shows, and how to get the
    others."""
    others = [b for b in budgets if b is not shown and b.sweep is not None]
    if not others:
        return None
    listed = "; ".join(f"`archspec report {printable(sweep_arg, 200)}{' ' + b.options if b.options else ''}` "
                       f"({len(b.run_ids)} runs)" for b in others)
    return (f"sweep {name!r} has run at {len(others) + 1} budgets; showing {shown.describe} "
            f"({len(shown.run_ids)} runs); the others: {listed}")


__all__ = ["SweepBudget", "budget_slug", "budgets_note", "file_budgets", "identity_overrides", "name_budgets",
           "options_text", "own_steps", "report_dir"]
