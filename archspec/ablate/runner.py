"""Run a sweep's jobs through the shared loop into the registry, and read the results back for the report.

Resuming is by content: a job's run id is its run key (model hash, learning-recipe hash, data hash, seed:
`archspec.train.logger.run_key`), the same id the loop records under, whatever the sweep or its variants are called.
Before training a job the runner makes the run a member of this sweep if it exists and asks its status: FINISHED is
skipped (so a second sweep holding the same experiment trains nothing and its report finds the run),
RUNNING (with a live heartbeat, i.e. another machine on the same registry) is left alone, anything else
(missing, FAILED, KILLED, SCHEDULED) is trained, which restarts it. Running the same command again resumes a sweep.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.markup import escape

from archspec.ablate.quantize import recorded_schemes, run_figures
from archspec.ablate.rates import RatePoint, best_rate
from archspec.ablate.report import STABILITY_CURVES, RunResult, VariantResult, label_overrides
from archspec.ablate.sweep import Job, Sweep, load_sweep, spec_diff, spec_text
from archspec.errors import UserError, printable
from archspec.registry import Registry, RegistryLogger, install_signal_handlers
from archspec.registry.query.parse import text_literal
from archspec.spec import parse_spec, model_hash
from archspec.cache import cache_dir
from archspec.train.data import build_data
from archspec.train.build import Build, prepare, run_recipe
from archspec.train.logger import FINISHED, RUNNING, RunInfo, RunLogger, SweepMembership
from archspec.train.sinks import with_sinks
from archspec.ablate.budgets import variant_identity
from archspec.recipe import RecipeView


def membership(sweep: Sweep, job: Job) -> SweepMembership:
    return SweepMembership(sweep.name, job.variant.index, job.variant.label, sweep.sweep_hash, sweep.file.baseline)


class SweepLogger:
    """Forwards to a RunLogger, making the run a member of its sweep (with its variant) so the registry alone can
    rebuild the report. Everything else passes through unchanged."""

    def __init__(self, inner: RunLogger, sweep: Sweep, job: Job):
        self.inner, self.sweep, self.job = inner, sweep, job

    def start(self, info: RunInfo) -> str:
        return self.inner.start(replace(info, sweep=membership(self.sweep, self.job)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class JobOutcome:
    job: Job
    run_id: str
    action: str  # trained | skipped (finished) | skipped (running elsewhere)
    status: str | None
    error: str | None = None


@dataclass
class SweepOutcome:
    outcomes: list[JobOutcome] = field(default_factory=list)

    def count(self, action: str) -> int:
        return sum(o.action == action for o in self.outcomes)


def job_build(job: Job, cache: Path) -> Build:
    """The job's build (archspec.train.build): its data (tokenised once per corpus and tokenizer, and cached), its
    run id — the one the loop records under, since the loop trains from this build — and its accounting."""
    return prepare(job.spec, build_data(job.spec, cache, rank=0, world=1), accounting=job.variant.accounting)


def check_data(jobs: list[Job], cache: Path) -> dict[str, Build]:
    """Prepare every job's build before anything trains: a variant whose data cannot work (a missing corpus, a
    vocabulary smaller than the tokenizer's) refuses the whole sweep, every such problem listed at once."""
    builds, problems = {}, []
    for job in jobs:
        try:
            builds[job.key] = job_build(job, cache)
        except UserError as e:
            problems.append(f"variant {job.variant.index} ({job.variant.label}), seed {job.seed}: {e.render()}")
    if problems:
        raise UserError(f"{len(problems)} problem(s) with the sweep's data; nothing was trained", problems)
    return builds


def run_jobs(sweep: Sweep, jobs: list[Job], registry_url: str | None, *, device: str = "auto",
             compile: bool | None = None, progress: bool = False, cache: str | Path | None = None,
             on_event: Callable[[str], None] = lambda line: None,
             logger_factory: Callable[[], RunLogger] | None = None, launcher=None) -> SweepOutcome:
    """Train every job not already FINISHED in the registry, in order. A FAILED run does not stop the sweep
    (it is recorded and redone next time); Ctrl-C/SIGTERM ends the current run KILLED and stops the sweep.
    launcher: None (this process trains), or an `archspec.launch.sweeps.LaunchRequest`: the jobs to train are
    submitted to it instead (recorded SCHEDULED), after the same checks and skips; or an
    `archspec.launch.packed.PackedRequest` (--jobs-per-device): several at once, each in its own process."""
    with install_signal_handlers():  # one scope for the whole sweep: a SIGTERM while checking is not lost either
        registry = Registry(registry_url)
        cache_path = cache_dir(cache)
        builds = check_fits(jobs, check_data(jobs, cache_path), device,  # a launcher's workers: their device type
                            device_type=launcher.device_type(device) if launcher is not None else None)
        return _run_checked(sweep, jobs, registry, registry_url, builds, device=device, compile=compile,
                            progress=progress, cache=cache, on_event=on_event, logger_factory=logger_factory,
                            launcher=launcher)


def check_fits(jobs: list[Job], builds: dict[str, Build], device: str,
               device_type: str | None = None) -> dict[str, Build]:
    """The memory check the loop makes before building a model (the loop keeps the plan checked here), made for
    every variant before anything trains: a later variant that cannot fit refuses the sweep up front instead of
    after the earlier ones have trained."""
    from archspec.train.distributed import resolve_device

    device_type = device_type or resolve_device(device).type
    problems, plans = [], {}
    for job in jobs:
        if job.variant.index not in plans:
            try:
                plans[job.variant.index] = builds[job.key].checked(device_type).memory
            except UserError as e:
                plans[job.variant.index] = None
                problems.append(f"variant {job.variant.index} ({job.variant.label}): {e}")
    if problems:
        raise UserError(f"{len(problems)} variant(s) of the sweep cannot fit in memory; nothing was trained", problems)
    return {job.key: replace(builds[job.key], memory=plans[job.variant.index], device=device_type) for job in jobs}


def _run_checked(sweep: Sweep, jobs: list[Job], registry: Registry, registry_url: str | None, builds: dict[str, Build],
                 *, device: str, compile: bool | None, progress: bool, cache: str | Path | None,
                 on_event: Callable[[str], None], logger_factory: Callable[[], RunLogger] | None,
                 launcher=None) -> SweepOutcome:
    from archspec.train.loop import train

    from archspec.train.progress import SweepPosition, clock

    outcome = SweepOutcome()
    if launcher is not None:  # --jobs-per-device: N from the checked plans; None when one at a time (trained here)
        launcher = launcher.prepare(builds, device, on_event)
    launched = []  # (job, run id, where): trained by the launcher, after the loop
    guesses = job_seconds(jobs, registry, device, cache) if progress and launcher is None else {}
    spent, guessed = 0.0, 0.0  # measured and estimated seconds of the runs trained so far: the estimates' scale
    for n, job in enumerate(jobs, 1):
        run_id = builds[job.key].experiment_id
        registry.reap()  # a sweep is a write place: a run whose process died is KILLED now, and trained below
        status = registry.run_status(run_id)
        where = f"[{n}/{len(jobs)}] v{job.variant.index} seed {job.seed} ({run_id})"
        if status in (FINISHED, RUNNING):  # the experiment exists (maybe under another sweep): it is this one's too
            registry.add_to_sweep(run_id, membership(sweep, job))
        if status == FINISHED:
            outcome.outcomes.append(JobOutcome(job, run_id, "skipped (finished)", status))
            on_event(f"{where}: finished earlier, skipped")
            continue
        if status == RUNNING:
            outcome.outcomes.append(JobOutcome(job, run_id, "skipped (running elsewhere)", status))
            on_event(f"{where}: running elsewhere (live heartbeat), skipped")
            continue
        if launcher is not None:
            launched.append((job, run_id, where))
            continue
        on_event(f"{where}: training {escape(job.variant.label)}" + (f" (was {status})" if status else ""))
        inner = logger_factory() if logger_factory else with_sinks(RegistryLogger(registry_url))  # train.log_to
        later = [guesses.get(j.key) for j in jobs[n:]]
        scale = spent / guessed if guessed > 0 else 1.0  # the estimates, corrected by what the runs so far took
        after = scale * sum(later) if guesses and None not in later else None
        began = time.monotonic()
        result = train(job.spec, device=device, logger=SweepLogger(inner, sweep, job), compile=compile,
                       progress=SweepPosition(f"sweep {sweep.name} {n}/{len(jobs)}", after) if progress else False,
                       cache=cache, build=builds[job.key])
        if guesses.get(job.key):
            spent, guessed = spent + time.monotonic() - began, guessed + guesses[job.key]
            if n < len(jobs) and None not in later:
                on_event(f"sweep {escape(sweep.name)}: {n}/{len(jobs)} done, about {clock(spent / guessed * sum(later))} "
                         "left (training and evaluation, estimates scaled by the runs so far)")
        outcome.outcomes.append(JobOutcome(job, result.run_id, "trained", result.status, result.error))
        on_event(f"{where}: {result.status}" + (f": {escape(printable(result.error))}" if result.error else
                                                f", val loss {result.metrics.get('val_loss', float('nan')):.4f}"))
    if launched:
        outcome.outcomes += launcher.run(sweep, launched, builds, registry, device=device, compile=compile,
                                         cache=cache, on_event=on_event)
    return outcome


def job_seconds(jobs: list[Job], registry: Registry, device: str, cache) -> dict[str, float | None]:
    """Each job's estimated seconds (training, evaluation, per-run overhead: archspec.ablate.estimate, as the dry run
    estimates them), for the sweep's ETA; {} when nothing can be estimated."""
    try:
        import torch

        from archspec.ablate.estimate import estimate, measured_runs, work_of
        from archspec.train.distributed import resolve_device
        from archspec.train.throughput import peak_flops

        dev = resolve_device(device)
        peak, _ = peak_flops(dev, torch.float32 if dev.type == "cpu" else torch.bfloat16, cache_dir(cache))
        out: dict[str, float | None] = {}
        by_precision: dict[str, list] = {}
        for job in jobs:
            t = job.spec.train
            measured = by_precision.setdefault(t.precision, measured_runs(registry, dev.type, t.precision))
            out[job.key] = estimate(model_hash(job.spec), (RecipeView.of(t).sequences_per_replica, t.seq_len),
                                    work_of(job.spec, job.variant.accounting), measured, peak).seconds
        return out
    except Exception:  # an ETA is a courtesy: never the reason a sweep does not train
        return {}


def recorded_baseline(rows, sweep_name: str, indices: list[int]) -> int:
    """The baseline the sweep's memberships recorded (the latest run's word wins), else the first variant."""
    for row in reversed(rows):
        if sweep_name in row.memberships:
            return row.memberships[sweep_name].baseline
    return min(indices)


def collect(registry: Registry, sweep_name: str, sweep: Sweep | None = None,
            only: set[str] | None = None) -> tuple[list[VariantResult], int]:
    """Every variant of a sweep with its runs, and the baseline's index, from the registry alone.

    The sweep's runs are found through membership (a run can belong to several sweeps). With the sweep file, only
    runs of its current variants count (matched by model hash and learning recipe, so an edited sweep never mixes in
    runs of an older definition), at every seed the sweep has run (the file's and any `--add-seeds` added), and
    variants with no runs yet are listed empty. Without it, variants are
    grouped by the variant their membership records, the latest attempt per (variant, seed).

    An lr_sweep (archspec.ablate.rates): a variant's runs are those at its best rate (RULE), and its rate curve holds
    each rate's pilot; without the sweep file a variant whose runs hold several train.lr is read the same way, its
    pilot being the seed run at the most rates.

    `only`: these run ids alone (one budget of the sweep, archspec.ablate.budgets).
    """
    rows = registry.runs(where=f"sweep = {text_literal(sweep_name)}", sort="created")
    if only is not None:
        rows = [r for r in rows if r.id in only]
    wanted = {variant_identity(model_hash(j.spec), run_recipe(j.spec)): j
              for j in sweep.all_jobs()} if sweep else {}
    by_variant: dict[int, dict[tuple[float | None, int], Any]] = {}
    for row in rows:
        if sweep is not None:
            job = wanted.get(variant_identity(row.model_hash, row.recipe))
            if job is None:
                continue
            index, lr = job.variant.index, job.lr
        else:
            index, lr = row.memberships[sweep_name].variant, row.recipe.get("lr")
        by_variant.setdefault(index, {})[(lr, row.seed)] = row  # sorted by created: the latest attempt wins
    rate_curves: dict[int, tuple[list[RatePoint], float | None]] = {}
    for index, found in list(by_variant.items()):
        rates = sweep.rates if sweep is not None else sorted({lr for lr, _ in found if lr is not None})
        if len(rates) > 1:
            pilot = sweep.pilot_seed if sweep is not None else _pilot_seed(found)
            points = [RatePoint(lr, found[(lr, pilot)].status if (lr, pilot) in found else None,
                                _final(found[(lr, pilot)]) if (lr, pilot) in found else None,
                                found[(lr, pilot)].id if (lr, pilot) in found else None) for lr in rates]
            best = best_rate(points)
            rate_curves[index] = (points, best)
            by_variant[index] = {(lr, seed): row for (lr, seed), row in found.items() if lr == best}
    if sweep is not None and sweep.rates:
        for v in sweep.variants:
            rate_curves.setdefault(v.index, ([RatePoint(lr, None, None) for lr in sweep.rates], None))
    by_variant = {index: {seed: row for (_, seed), row in found.items()} for index, found in by_variant.items()}

    indices = sorted(set(by_variant) | ({v.index for v in sweep.variants} if sweep else set()))
    if not indices:
        return [], sweep.file.baseline if sweep else 0
    specs = {}
    for index in indices:
        runs = by_variant.get(index, {})
        if sweep is not None:
            specs[index] = sweep.variants[index].spec
        else:
            specs[index] = parse_spec(next(iter(runs.values())).spec)
    baseline_index = sweep.file.baseline if sweep else recorded_baseline(rows, sweep_name, indices)
    base_spec = specs.get(baseline_index, specs[indices[0]])

    variants = []
    for index in indices:
        runs = by_variant.get(index, {})
        results = []
        for seed, row in sorted(runs.items()):
            history = [(p.step, p.value) for p in registry.metric_history(row.id, "val_loss")]
            stability = {key: [(p.step, p.value) for p in registry.metric_history(row.id, key)]
                         for key in STABILITY_CURVES if key in row.summary}  # train.stability runs only
            quant = {}
            if sweep is None or sweep.file.quantize:  # the sweep's `quantize:` evaluations (archspec.ablate.quantize)
                evaluations = registry.evaluations(row.id)
                quant = run_figures(evaluations, sweep.file.quantize if sweep else recorded_schemes(evaluations),
                                    sweep.file.quantize_group_size if sweep else None)
            results.append(RunResult(
                run_id=row.id, seed=seed, status=row.status,
                final_val_loss=_final(row),
                tokens_per_s=row.summary.get("tokens_per_s"),
                history=history, tokens_per_step=row.tokens_per_step or 0, summary=dict(row.summary), note=row.note,
                curves=stability, quant=quant,
            ))
        spec = specs[index]
        if sweep is not None:
            acc, label = sweep.variants[index].accounting, sweep.variants[index].label
            acc_d = acc.to_dict()
            overrides = {k: spec_text(v) for k, v in sweep.variants[index].overrides.items()}
        else:
            first = next(iter(runs.values()))
            acc_d, label = first.accounting, first.memberships[sweep_name].label
            overrides = label_overrides(label)
        variants.append(VariantResult(
            index=index, label=label, diff=spec_diff(base_spec, spec),
            params_total=int(acc_d["params"]["total"]), params_active=int(acc_d["params"]["active"]),
            flops_train_per_token=int(acc_d["flops_per_token"]["train"]),
            kv_cache_bytes_per_token=int(acc_d["kv_cache_bytes_per_token"]), runs=results,
            attention_flops_per_token=acc_d["flops_per_token"].get("attention"),  # None for runs recorded before
            overrides=overrides,
            matched=_matched(sweep.variants[index].solution) if sweep is not None else None,
            rates=[{"lr": p.lr, "status": p.status, "val_loss": p.val_loss, "run_id": p.run_id}
                   for p in rate_curves[index][0]] if index in rate_curves else None,
            best_lr=rate_curves[index][1] if index in rate_curves else None,
        ))
    return variants, baseline_index


def _final(row) -> float | None:
    return row.summary.get("val_loss", row.metrics.get("val_loss"))


def _pilot_seed(found: dict[tuple[float | None, int], Any]) -> int:
    """Without the sweep file: the seed run at the most rates (the smallest on a tie)."""
    counts: dict[int, int] = {}
    for _, seed in found:
        counts[seed] = counts.get(seed, 0) + 1
    return min(counts, key=lambda seed: (-counts[seed], seed))


def _matched(solution) -> dict[str, Any] | None:
    """A solved width as the report shows it (archspec.ablate.match.Solution)."""
    if solution is None:
        return None
    return {"key": solution.key, "value": solution.value, "measure": solution.measure, "count": solution.count,
            "target": solution.target, "residual": solution.residual}


@dataclass
class Found:
    """A sweep's runs as a report entry point found them (`find_runs`)."""

    name: str
    sweep: Sweep | None  # the sweep file as loaded with the options, None when given by name or when it fell back
    variants: list  # VariantResult
    baseline: int
    note: str | None = None  # said when the runs were found some other way than asked
    steps: int | None = None  # the budget shown (archspec.ablate.budgets): its --steps and --set
    overrides: tuple[str, ...] = ()


def _options_text(overrides: Sequence[str], seeds: Sequence[int] | None, steps: int | None) -> str:
    return "".join([*(f" --set {o}" for o in overrides), f" --seeds {','.join(map(str, seeds))}" if seeds else "",
                    f" --steps {steps}" if steps else ""])


def _recipes_seen(registry: Registry, name: str) -> str:
    """How the runs recorded under the sweep's name were trained (steps, seeds): so an error can say which options
    would select them."""
    rows = registry.runs(where=f"sweep = {text_literal(name)}", sort="created")
    steps = sorted({int(r.recipe.get("steps", 0)) for r in rows if r.recipe.get("steps")})
    seeds = sorted({r.seed for r in rows})
    if not rows:
        return ""
    return (f"{len(rows)} run(s) of sweep {name!r} are recorded, trained at steps {', '.join(map(str, steps))}, "
            f"seeds {', '.join(map(str, seeds))}")


def find_runs(registry: Registry, sweep_arg: str, *, overrides: Sequence[str] = (), seeds: Sequence[int] | None = None,
              steps: int | None = None, command: str = "report") -> Found:
    """The runs a report (`archspec report`, `archspec scaling`) shows for SWEEP, a sweep file or a sweep name.

    A file is loaded with the options `archspec ablate` took (`--set`, `--seeds`, `--steps`), so its variants are
    those ablate trained and their runs are matched by model and recipe. A file given without options whose variants
    have no runs (they were trained with, e.g., `--steps 40`) falls back to the runs recorded as members of its sweep,
    grouped by the variant each membership names, with a note saying so. `seeds` restricts the report to those seeds.
    When there are truly no runs, the error names what was looked for and the command that trains them."""
    path = Path(sweep_arg)
    is_file = path.suffix in (".yaml", ".yml") or path.exists()
    if not is_file and (overrides or steps):
        raise UserError(f"--set/--steps need a sweep file, got the sweep name {printable(sweep_arg, 100)!r}")
    loaded = load_sweep(path, overrides=overrides, seeds=seeds, steps=steps) if is_file else None
    name = loaded.name if loaded else sweep_arg
    budget = None
    if is_file and not (overrides or steps):  # the file alone: the budget it has run at (archspec.ablate.budgets)
        from archspec.ablate.budgets import budgets_note, file_budgets

        budgets = file_budgets(registry, path)
        known = [b for b in budgets if b.sweep is not None]
        if known:
            budget = known[0]  # the file as written when it has runs, else the budget run last
            if seeds is not None and budget.sweep is not None:
                budget.sweep = load_sweep(path, overrides=budget.overrides, seeds=seeds, steps=budget.steps)
            variants, baseline = collect(registry, name, budget.sweep, only=set(budget.run_ids))
            loaded = budget.sweep
            note = budgets_note(name, budgets, budget, sweep_arg)
            if budget.options:
                note = (note + "; " if note else "") + (f"{printable(sweep_arg, 200)} as written has no runs; "
                                                         f"showing its runs at {budget.options}")
        elif budgets:  # only runs of an earlier definition of the file: grouped by their recorded variant
            variants, baseline = collect(registry, name, None)
            loaded = None
            note = (f"no run matches {printable(sweep_arg, 200)} at any budget (it was edited since); showing the "
                    f"runs recorded as members of sweep {name!r} ({_recipes_seen(registry, name)})")
        else:
            variants, baseline = collect(registry, name, loaded)
            note = None
    elif not is_file:  # a name: its budgets as the UI tells them apart, the latest shown (archspec.ablate.budgets)
        from archspec.ablate.budgets import name_budgets

        budgets = name_budgets(registry, name)
        note = None
        if len(budgets) > 1:
            latest = budgets[0]
            variants, baseline = collect(registry, name, None, only=set(latest.run_ids))
            note = (f"sweep {name!r} has run at {len(budgets)} budgets; showing the latest ({latest.label}, "
                    f"{len(latest.run_ids)} runs); the others: "
                    + "; ".join(f"{b.label} ({len(b.run_ids)} runs)" for b in budgets[1:])
                    + "; give the sweep file and its options (--steps/--set) to choose one")
        else:
            variants, baseline = collect(registry, name, loaded)
    else:
        variants, baseline = collect(registry, name, loaded)
        note = None
    if seeds is not None:
        wanted = set(seeds)
        for v in variants:
            v.runs = [r for r in v.runs if r.seed in wanted]
    if not any(v.runs for v in variants):
        options = _options_text(overrides, seeds, steps)
        if loaded is not None:
            budget = (json.dumps(loaded.file.budget.model_dump(exclude_none=True)) if loaded.file.budget
                      else "each variant's train.steps")
            looked = (f"runs of the {len(loaded.variants)} variant(s) of {printable(sweep_arg, 200)} at budget "
                      f"{budget}" + (f", seeds {', '.join(map(str, seeds))}" if seeds else "")
                      + (f", with --set {' '.join(overrides)}" if overrides else ""))
            train = f"archspec ablate {printable(sweep_arg, 200)}{options}"
        else:
            looked = f"runs recorded as members of sweep {printable(name, 100)!r}" + (
                f" at seeds {', '.join(map(str, seeds))}" if seeds else "")
            train = "archspec ablate SWEEP_FILE (whose name: is " + printable(name, 100) + ")"
        seen = _recipes_seen(registry, name)
        raise UserError(f"{command} {printable(sweep_arg, 200)}: no runs in the registry {registry.url}: looked for "
                        f"{looked}" + (f"; {seen}: give the options they were trained with" if seen else "")
                        + f"; `{train}` trains them")
    if budget is not None:
        steps, overrides = budget.steps, budget.overrides
    return Found(name, loaded, variants, baseline, note, steps=steps, overrides=tuple(overrides))
