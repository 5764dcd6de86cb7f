"""`archspec ablate SWEEP` and `archspec report SWEEP`."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from archspec.ablate.sweep import Sweep, load_sweep, parse_shard
from archspec.cli.options import device_option, eval_tokens_option, log_to_option, registry_option, set_option
from archspec.launch.options import launcher_options
from archspec.console import echo, human, make_console
from archspec.errors import UserError, printable
from archspec.spec.train import MAX_STEPS
from archspec.recipe import RecipeView


def _seeds(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    from archspec.cli.options import int_list

    seeds = int_list(value)
    if not seeds or any(x < 0 for x in seeds) or len(set(seeds)) != len(seeds):
        raise click.BadParameter(f"expected distinct non-negative integers, e.g. 0,1,2; got {value!r}")
    return seeds


def _jobs_per_device(ctx, param, value: str | None) -> int | str | None:
    if value is None:
        return None
    from archspec.launch.packed import parse_jobs_per_device

    try:
        return parse_jobs_per_device(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _out_option(f):
    return click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Where the report's PNG and HTML go (default reports/<sweep>/).")(f)


def dry_run_table(sweep: Sweep, jobs, peak: float | None, measured=(), device_type: str = "cpu") -> Table:
    """The variant table; times from the registry's measured throughput (`measured`, archspec.ablate.estimate), else
    from the stated assumption on `peak`."""
    from archspec.ablate.estimate import caption, estimate, sweep_start, work_of
    from archspec.spec import model_hash

    if sweep.rates:
        shape = (f"{len(sweep.variants)} variants × {len(sweep.rates)} rates at pilot seed {sweep.pilot_seed} = "
                 f"{len(sweep.jobs)} pilot runs, then {len(sweep.file.seeds) - 1} more seed(s) per variant at its best "
                 "rate")
    else:
        shape = f"{len(sweep.variants)} variants × {len(sweep.file.seeds)} seeds = {len(sweep.jobs)} runs"
    table = Table(title=f"sweep {sweep.name}: {shape}" + (f" ({len(jobs)} in this shard)" if len(jobs) != len(sweep.jobs)
                                                          else ""), title_justify="left")
    for col in ("variant", "differs from base", "params", "active", "train FLOPs/tok", "KV B/tok", "steps", "tokens",
                "evals × tokens", "eval share", "est. time/run"):
        table.add_column(col, justify="left" if col in ("variant", "differs from base") else "right", overflow="fold")
    total_s = eval_total_s = 0.0
    for v in sweep.variants:
        t = v.spec.train
        work = work_of(v.spec, v.accounting)
        est = estimate(model_hash(v.spec), (RecipeView.of(t).sequences_per_replica, t.seq_len), work, list(measured),
                       peak)
        seconds = est.seconds
        n_jobs = sum(j.variant.index == v.index for j in jobs)
        total_s += (seconds or 0) * n_jobs
        eval_total_s += est.eval_s * n_jobs
        share = (f"{est.eval_share:.0%} of time" if est.eval_share is not None
                 else f"{work.eval_flop_share:.0%} of FLOPs")
        time_text = (f"{seconds:.0f} s (train {est.train_s:.0f} + eval {est.eval_s:.0f} + {est.fixed_s:.0f} fixed; "
                     f"{est.basis})" if seconds is not None else "-")
        label = v.label + (f"; matched: {v.solution.text()}" if v.solution is not None else "")
        table.add_row(f"v{v.index}" + (" (baseline)" if v.index == sweep.file.baseline else ""), label,
                      f"{v.accounting.total:,}", f"{v.accounting.active:,}", human(v.accounting.flops_train),
                      f"{v.accounting.kv_cache_bytes_per_token:,}", f"{t.steps:,}", human(work.steps * work.tokens_per_step),
                      f"{work.evals} × {human(work.eval_tokens)}", share, time_text)
    start_s = sweep_start(list(measured), peak) if jobs else None  # once per sweep, when this boot measured it
    total_s += start_s or 0.0
    total = f"{total_s:.0f} s" if total_s < 600 else f"{total_s / 60:.1f} min"  # short sweeps to the second
    evaluation = (f" ({eval_total_s / total_s:.0%} of it evaluation" + (f", {start_s:.0f} s the sweep's start"
                                                                         if start_s else "") + ")") if total_s else ""
    table.caption = (f"estimated total {total}{evaluation} for this shard's {len(jobs)} runs; "
                     + caption(list(measured), peak, device_type))
    table.caption_justify = "left"
    return table


def _report(console: Console, sweep_name: str, sweep: Sweep | None, registry_url, out_dir: Path | None,
            as_json: bool = False, found=None, steps: int | None = None, overrides: tuple[str, ...] = ()) -> None:
    """The report of a sweep; `found` (archspec.ablate.runner.find_runs) when the entry point has looked its runs up
    already (`archspec report`), else the runs of `sweep` as just trained."""
    from archspec.ablate.report import (
        EFFECTS_CAPTION,
        effect_numbers,
        effect_rows,
        main_effects,
        rich_table,
        variant_numbers,
        write_report,
    )
    from archspec.ablate.runner import collect
    from archspec.registry import Registry, default_url
    from archspec.registry.query.parse import text_literal

    registry = Registry(registry_url)
    if found is not None:
        variants, baseline, sweep = found.variants, found.baseline, found.sweep
        steps, overrides = found.steps, found.overrides
        if found.note:
            make_console(stderr=True).print(f"note: {escape(found.note)}")
    else:
        variants, baseline = collect(registry, sweep_name, sweep)
    if not variants or not any(v.runs for v in variants):
        raise UserError(f"sweep {sweep_name!r}: no runs in the registry {registry_url or default_url()} yet; "
                        f"run `archspec ablate` first")
    from archspec.ablate.budgets import options_text, report_dir

    if sweep is not None:  # the options that made this budget, as the sweep was loaded with them
        steps, overrides = sweep.steps_option, sweep.overrides
    out_dir = out_dir or report_dir(sweep_name, steps, overrides)  # one folder per budget: none overwrites another
    meta = {"sweep": sweep_name, "registry": registry_url or default_url(),
            "seeds": ", ".join(sorted({str(r.seed) for v in variants for r in v.runs}))}
    evaluated = sorted({int(r.summary["eval_tokens"]) for v in variants for r in v.runs if "eval_tokens" in r.summary})
    if evaluated:
        meta["eval tokens"] = (f"{evaluated[0]:,}" if len(evaluated) == 1 else
                               f"differ between runs ({', '.join(f'{n:,}' for n in evaluated)}): compare with care")
    if sweep is not None:
        meta["budget"] = json.dumps(sweep.file.budget.model_dump(exclude_none=True)) if sweep.file.budget else "train.steps"
        if options_text(steps, overrides):
            meta["options"] = options_text(steps, overrides)
        if sweep.rates:
            from archspec.ablate.rates import rule_text

            meta["lr rule"] = f"lr_sweep {', '.join(f'{r:g}' for r in sweep.rates)}: {rule_text(sweep.pilot_seed)}"
        if sweep.file.match:
            meta["matched"] = (f"{sweep.file.match} equal to the baseline's within {sweep.file.tolerance:.1%}, by "
                               f"solving {sweep.file.solve} (multiples of {sweep.file.multiple_of}) per variant")
    from archspec.ablate.report import load_differed

    if load_differed(variants):
        meta["tok/s"] = load_differed(variants)
        if not as_json:
            make_console(stderr=True).print(f"note: {escape(load_differed(variants))}")
    schemes = sorted({s for v in variants for r in v.runs for s in r.quant})
    if schemes:
        meta["quantized"] = (f"{', '.join(schemes)} (archspec quantize, weight-only): Δ = quantized − trained val loss "
                             f"on each run's validation set, mean [95% t interval] over the finished seeds")
    from archspec.ablate.scaling import sweep_fits

    ids = {r.run_id for v in variants for r in v.runs}
    run_rows = [r for r in registry.runs(where=f"sweep = {text_literal(sweep_name)}", sort="created") if r.id in ids]
    fits = sweep_fits(run_rows, sorted({k for v in variants for k in (*v.overrides, *v.diff)}))
    rows, png, html = write_report(sweep_name, variants, baseline, out_dir, meta, fits)
    effects = main_effects(variants, baseline)
    if as_json:
        echo(json.dumps({"sweep": sweep_name, "baseline": baseline, "rows": rows,
                               "variants": variant_numbers(variants, baseline), "main_effects": effect_numbers(effects),
                               "png": str(png), "html": str(html)}))
        return
    console.print(rich_table(f"ablation {sweep_name}", rows))
    if effects:
        console.print(rich_table(f"main effects of {sweep_name}", effect_rows(effects), EFFECTS_CAPTION))
    console.print(f"plots: {png}\nreport: {html}")


@click.command()
@click.argument("sweep_path", metavar="SWEEP", type=click.Path(dir_okay=False, path_type=Path))
@registry_option
@click.option("--shard", default="0/1", show_default=True, metavar="I/N",
              help="Run only shard I of N (deterministic split; N machines on one registry split a sweep).")
@set_option
@click.option("--seeds", callback=_seeds, metavar="0,1,2", help="Seeds to train each variant with (replaces the file's seeds).")
@click.option("--steps", type=click.IntRange(1, MAX_STEPS), help="Train every variant this many steps (replaces the file's budget).")
@eval_tokens_option
@click.option("--add-seeds", type=click.IntRange(1, 1000), metavar="N",
              help="Extend a sweep that has run with N more seeds per variant (the next unused seed numbers), "
                   "training only the new runs; the report then holds every seed.")
@click.option("--dry-run", is_flag=True, help="Print the variant table and train nothing.")
@device_option
@click.option("--no-compile", is_flag=True, help="Train eager: train.compile=none for every run (faster for very short runs).")
@log_to_option
@_out_option
@click.option("--json", "as_json", is_flag=True, help="Print the report rows as one JSON object on stdout.")
@launcher_options
@click.option("--jobs-per-device", "jobs_per_device", callback=_jobs_per_device, metavar="N|auto", default=None,
              help="Train up to N runs at once on each device, each in its own process with its own registry row "
                   "(auto: as many as the memory plan fits on the GPU, at most 8; 1 on CPU). Default: one at a time "
                   "in this process.")
@click.option("--status", "show_status", is_flag=True,
              help="Print where each variant stands (queued / running / finished / failed) from the registry; "
                   "train nothing.")
def ablate_cmd(sweep_path: Path, registry_url, shard: str, overrides: tuple[str, ...], seeds: list[int] | None,
               steps: int | None, eval_tokens: int | None, add_seeds: int | None, dry_run: bool, device: str, no_compile: bool,
               log_to: str | None, out_dir: Path | None, as_json: bool, show_status: bool = False,
               jobs_per_device: int | str | None = None, **launch):
    """Train every variant × seed of SWEEP (skipping finished runs), then report what mattered.

    --set applies to the sweep's base spec (a grid key still wins), so a changed sweep trains runs of its own."""
    console = make_console(stderr=True)
    index, count = parse_shard(shard)
    if eval_tokens is not None:  # the base's validation size (a grid key still wins): observation, not identity
        overrides = (*overrides, f"train.eval_tokens={eval_tokens}")
    # every variant validated before anything trains
    sweep = load_sweep(sweep_path, overrides=overrides, seeds=seeds, steps=steps)
    if show_status:
        from archspec.launch.status import sweep_status
        from archspec.registry import Registry

        registry = Registry(registry_url)
        if overrides or steps is not None or seeds is not None:
            make_console().print(sweep_status(registry, sweep.name, sweep)[0])
            return
        from archspec.ablate.budgets import file_budgets

        budgets = file_budgets(registry, sweep_path)  # no options: every budget the file has run at
        if not budgets:
            make_console().print(sweep_status(registry, sweep.name, sweep)[0])
            return
        for budget in budgets:
            make_console().print(sweep_status(registry, sweep.name, budget.sweep, only=set(budget.run_ids),
                                              title=budget.describe)[0])
        return
    if add_seeds is not None:
        if seeds is not None:
            raise UserError("--add-seeds N and --seeds: give one (--add-seeds picks the next unused seeds itself)")
        sweep = _with_added_seeds(sweep, sweep_path, add_seeds, registry_url, overrides, steps, console)
    jobs = sweep.shard(index, count)
    if dry_run:
        import torch

        from archspec.ablate.estimate import measured_runs
        from archspec.registry import Registry
        from archspec.cache import cache_dir
        from archspec.train.throughput import peak_flops

        dev = torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")
        # a dry run only reads: with no ceiling cached it measures one for its estimate and keeps nothing
        peak, _ = peak_flops(dev, torch.float32 if dev.type == "cpu" else torch.bfloat16, cache_dir(None), store=False)
        measured = measured_runs(Registry(registry_url), dev.type, sweep.baseline.spec.train.precision)
        make_console().print(dry_run_table(sweep, jobs, peak, measured, dev.type))
        return
    from archspec.ablate.runner import run_jobs
    from archspec.train.sinks import parse_log_to, registry_with_sinks, resolve_sinks

    settings = _launcher_settings(sweep, launch, registry_url)  # before anything is recorded or submitted

    sinks = parse_log_to(log_to)  # None: each run's train.log_to; every package checked before anything trains
    resolve_sinks(sinks, [j.spec.train for j in jobs])
    request = None
    if settings.kind != "local":
        from archspec.launch.sweeps import LaunchRequest

        request = LaunchRequest(settings, sinks, detach=launch.get("detach", False))
    if jobs_per_device is not None:
        if settings.kind != "local":
            raise UserError(f"--jobs-per-device packs runs on this machine's devices; --launcher {settings.kind} "
                            "schedules its jobs itself (give one of the two)")
        from archspec.launch.packed import PackedRequest

        request = PackedRequest(settings, jobs_per_device, sinks)

    def run(these):
        return run_jobs(sweep, these, registry_url, device=device, compile=False if no_compile else None,
                        progress=not as_json, on_event=console.print,
                        logger_factory=lambda: registry_with_sinks(registry_url, sinks), launcher=request)

    outcome = run(jobs)
    if sweep.rates:  # the pilots have run (here or elsewhere): the other seeds at each variant's best rate
        outcome.outcomes += _seed_phase(sweep, index, count, registry_url, run, console).outcomes
    from archspec.train.logger import FAILED, FINISHED

    ran = [o for o in outcome.outcomes if o.action == "trained"]
    untrained = [o for o in ran if o.status not in (FINISHED, FAILED)]  # REFUSED, KILLED, still SCHEDULED
    failed = sum(o.status == FAILED for o in ran)
    console.print(f"sweep {sweep.name}: {len(ran) - len(untrained)} trained"
                  + (f" ({failed} of them FAILED)" if failed else "")
                  + (f", {len(untrained)} NOT trained" if untrained else "")
                  + f", {outcome.count('skipped (finished)')} already finished, "
                  f"{outcome.count('skipped (running elsewhere)')} running elsewhere"
                  + (f", {outcome.count('submitted')} submitted" if outcome.count("submitted") else ""))
    if untrained:
        first = untrained[0]
        why = (first.error or "").strip().splitlines()
        raise UserError(f"sweep {sweep.name}: {len(untrained)} of {len(ran)} run(s) were not trained (run "
                        f"{first.run_id} {first.status or 'not started'}" + (f": {printable(why[0], 300)}" if why else "")
                        + "); no report is written from a sweep that did not run; `archspec ablate --status` shows "
                        "where each run stands")
    if sweep.file.quantize and not outcome.count("submitted"):
        _quantize_phase(sweep, outcome, registry_url, console)
    if outcome.count("submitted"):
        import shlex

        from archspec.ablate.budgets import options_text
        from archspec.console import program

        options = options_text(sweep.steps_option, sweep.overrides)
        echo(f"submitted {outcome.count('submitted')} job(s); follow them with: {program()} ablate "
             f"{shlex.quote(printable(str(sweep_path)))}{' ' + options if options else ''} --status"
             + (f" --registry {shlex.quote(registry_url)}" if registry_url else ""))
        return
    _report(make_console(), sweep.name, sweep, registry_url, out_dir, as_json,  # the verdict goes to stdout
            steps=steps, overrides=tuple(overrides))


def _quantize_phase(sweep: Sweep, outcome, registry_url, console) -> None:
    """The sweep's `quantize:`: each finished run the report holds (at an lr_sweep's best rate only) quantized at each
    scheme it has no evaluation of yet (archspec.ablate.quantize)."""
    from archspec.ablate.quantize import quantize_runs
    from archspec.ablate.runner import collect
    from archspec.registry import Registry
    from archspec.train.logger import FINISHED

    finished = {o.run_id for o in outcome.outcomes if o.status == FINISHED}
    variants, _ = collect(Registry(registry_url), sweep.name, sweep)
    ids = [r.run_id for v in variants for r in v.runs if r.status == FINISHED and r.run_id in finished]
    counts = quantize_runs(ids, sweep.file.quantize, sweep.file.quantize_group_size, registry_url,
                           on_event=lambda line: console.print(escape(line)))
    console.print(f"sweep {sweep.name}: {counts['quantized']} quantized ({', '.join(sweep.file.quantize)}), "
                  f"{counts['skipped']} already quantized")


def _launcher_settings(sweep: Sweep, launch: dict, registry_url):
    """The launcher's settings (the sweep file's launcher: section under the options), checked before anything
    trains: a missing extra, no sbatch, SQLite for a multi-host launcher, options of another launcher: exit 2."""
    from archspec.launch.base import sqlite_absolute
    from archspec.launch.choose import check_detach, check_launcher
    from archspec.launch.options import settings_from
    from archspec.registry import default_url

    settings = settings_from(launch, sweep.file.launcher)
    check_launcher(settings, sqlite_absolute(registry_url or default_url()))
    if launch.get("detach"):
        check_detach(settings)
    return settings


def _seed_phase(sweep: Sweep, index: int, count: int, registry_url, run, console):
    """An lr_sweep's second phase: each variant whose pilots are all done trains its other seeds at its best rate
    (archspec.ablate.rates); a variant whose pilots are not (another shard's, still running) is named, and the same
    command trains its seeds once they are."""
    from archspec.ablate.rates import rule_text
    from archspec.ablate.runner import SweepOutcome, collect
    from archspec.registry import Registry

    variants, _ = collect(Registry(registry_url), sweep.name, sweep)
    best = {v.index: v.best_lr for v in variants if v.best_lr is not None}
    waiting = [v.index for v in variants if v.best_lr is None]
    console.print(f"sweep {sweep.name}: best rates " + (", ".join(f"v{i} {lr:g}" for i, lr in sorted(best.items()))
                                                        or "none yet") + f" ({rule_text(sweep.pilot_seed)})")
    if waiting:
        console.print(f"note: variant(s) {', '.join(f'v{i}' for i in waiting)}: pilots not all finished or failed "
                      "(another shard's, or every pilot failed); their other seeds train when this command runs "
                      "again after them")
    jobs = sweep.shard(index, count, sweep.seed_jobs(best))
    return run(jobs) if jobs else SweepOutcome()


def _with_added_seeds(sweep: Sweep, sweep_path: Path, n: int, registry_url, overrides, steps, console) -> Sweep:
    """The sweep at N new seeds per variant: the next N seed numbers above every seed it has run at (its file's and
    earlier --add-seeds'). Only a sweep that has run can be extended: with no run in the registry it is an error."""
    from archspec.ablate.runner import collect
    from archspec.ablate.sweep import MAX_SEEDS
    from archspec.registry import Registry, default_url

    variants, _ = collect(Registry(registry_url), sweep.name, sweep)
    ran = {r.seed for v in variants for r in v.runs}
    if not ran:
        raise UserError(f"--add-seeds: sweep {sweep.name!r} has no runs in the registry {registry_url or default_url()} "
                        f"for its variants; run `archspec ablate {sweep_path}` first")
    seeds = ran | set(sweep.file.seeds)
    if len(seeds) + n > MAX_SEEDS:
        raise UserError(f"--add-seeds {n}: the sweep would have {len(seeds) + n} seeds, more than the limit of "
                        f"{MAX_SEEDS}")
    finished = sum(r.status == "FINISHED" and r.seed in sweep.file.seeds for v in variants for r in v.runs)
    # an lr_sweep's variants hold their runs at the best rate: one per seed of the file once it has run
    expected = len(sweep.variants) * len(sweep.file.seeds) if sweep.rates else len(sweep.jobs)
    if finished < expected:
        console.print(f"note: {expected - finished} run(s) at the sweep's own seeds are not finished; "
                      f"`archspec ablate {escape(printable(str(sweep_path)))}` trains them (--add-seeds trains only "
                      "the new seeds)")
    start = max(seeds) + 1
    new = list(range(start, start + n))
    console.print(f"sweep {sweep.name}: adding seeds {', '.join(map(str, new))} "
                  f"(it has run at {', '.join(map(str, sorted(ran)))})")
    if sweep.rates:  # the pilot stays the file's first seed (its runs are done: skipped); the new seeds go to the best rate
        others = sorted(seeds - set(sweep.file.seeds))
        return load_sweep(sweep_path, overrides=overrides, seeds=[*sweep.file.seeds, *others, *new], steps=steps)
    return load_sweep(sweep_path, overrides=overrides, seeds=new, steps=steps)


@click.command()
@click.argument("sweep", metavar="SWEEP")
@registry_option
@set_option
@click.option("--seeds", callback=_seeds, metavar="0,1,2",
              help="With a sweep file: the seeds `archspec ablate --seeds` trained (the report shows only these).")
@click.option("--steps", type=click.IntRange(1, MAX_STEPS),
              help="With a sweep file: its runs trained by `archspec ablate SWEEP --steps N`.")
@_out_option
@click.option("--json", "as_json", is_flag=True, help="Print the report rows as one JSON object on stdout.")
def report_cmd(sweep: str, registry_url, overrides: tuple[str, ...], seeds: list[int] | None, steps: int | None,
               out_dir: Path | None, as_json: bool):
    """Rebuild a sweep's report (table, PNG, HTML) from the registry alone. SWEEP: a sweep file or a sweep name.

    With a sweep file, --set/--seeds/--steps select the runs `archspec ablate` trained with the same options; a file
    given without them whose variants have no runs shows the runs recorded as members of its sweep (with a note)."""
    from archspec.ablate.runner import find_runs
    from archspec.registry import Registry

    found = find_runs(Registry(registry_url), sweep, overrides=overrides, seeds=seeds, steps=steps)
    _report(make_console(), found.name, found.sweep, registry_url, out_dir, as_json, found=found)
