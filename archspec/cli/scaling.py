"""`archspec scaling SWEEP | --where FILTER`: fit L = E + A·x^(−α) over finished runs (see archspec.ablate.scaling)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import click

from archspec.cli.options import registry_option, set_option
from archspec.console import echo
from archspec.errors import UserError, printable
from archspec.registry.query.parse import text_literal
from archspec.spec.train import MAX_STEPS


def _source_rows(registry, sweep: str | None, where: str | None, overrides: tuple[str, ...] = (),
                 steps: int | None = None, seeds: list[int] | None = None) -> tuple[list, str]:
    """The runs to fit and a name for them. A sweep (file or name) gives its runs as the ablation report sees them
    (with the file: only runs of its current variants, the latest attempt per variant and seed; `overrides`/`steps`
    as `archspec ablate --set/--steps/--seeds` took them; archspec.ablate.runner.find_runs)."""
    from archspec.ablate.runner import find_runs

    if where is not None:
        rows = registry.runs(where=where, sort="created")
        if not rows:
            raise UserError(f"--where {printable(where, 200)!r}: no run in the registry {registry.url} matches")
        return list(rows), "scaling-where-" + hashlib.sha256(where.encode()).hexdigest()[:8]
    assert sweep is not None
    found = find_runs(registry, sweep, overrides=overrides, seeds=seeds, steps=steps, command="scaling")
    if found.note:
        from archspec.console import make_console
        from rich.markup import escape

        make_console(stderr=True).print(f"note: {escape(found.note)}")
    name = found.name
    ids = {r.run_id for v in found.variants for r in v.runs}
    rows = [r for r in registry.runs(where=f"sweep = {text_literal(name)}", sort="created") if r.id in ids]
    return rows, name


def _seeds_option(ctx, param, value):
    from archspec.cli.ablate import _seeds

    return _seeds(ctx, param, value)


def _check_by(by: tuple[str, ...]) -> None:
    from archspec.registry.query.fields import resolve_field

    for key in by:
        try:
            resolve_field(key, "runs")
        except ValueError as e:
            raise UserError(f"--by {printable(key, 100)!r}: {e}") from None


def _interval(result, name: str) -> str:
    if not result.interval:
        return "-"
    lo, hi = result.interval[name]
    return f"[{_num(lo)}, {_num(hi)}]"


def _num(v: float) -> str:
    from archspec.console import number

    return number(v)


@click.command()
@click.argument("sweep", metavar="SWEEP", required=False)
@click.option("--where", "-w", metavar="FILTER", help="Fit the runs this filter selects instead of a sweep's, e.g. "
              "\"params.train.steps = 977 and params.model.n_layers >= 2\" (`archspec runs list --help`).")
@registry_option
@set_option
@click.option("--steps", type=click.IntRange(1, MAX_STEPS),
              help="With a sweep file: its runs trained by `archspec ablate SWEEP --steps N`.")
@click.option("--seeds", callback=_seeds_option, metavar="0,1,2",
              help="With a sweep: only the runs at these seeds (as `archspec ablate --seeds` trained them).")
@click.option("--over", type=click.Choice(("auto", "params", "compute")), default="auto", show_default=True,
              help="x of the fit: non-embedding (active) parameters, or training FLOPs; auto: parameters when every "
                   "run of a group trained on the same tokens, else compute.")
@click.option("--by", multiple=True, metavar="FIELD",
              help="Group runs by this run field (repeatable; e.g. params.model.ffn.kind) instead of by architecture "
                   "(the model spec less its size keys). Runs on different data are never fitted together.")
@click.option("--bootstrap", "n_boot", type=click.IntRange(50, 100_000), default=1000, show_default=True,
              help="Bootstrap replicates (seeds redrawn at every size) for the 95% intervals.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the PNG goes (default reports/<sweep>/).")
@click.option("--json", "as_json", is_flag=True, help="Print the fits as one JSON object on stdout.")
def scaling_cmd(sweep: str | None, where: str | None, registry_url: str | None, overrides: tuple[str, ...],
                steps: int | None, seeds: list[int] | None, over: str, by: tuple[str, ...], n_boot: int, out_dir: Path | None,
                as_json: bool) -> None:
    """Fit L = E + A·x^(−α) over the finished runs of SWEEP (a sweep file or name), or those --where selects.

    x: non-embedding parameters N (active parameters for routed experts) at a fixed token budget, or training compute
    when budgets vary. One fit per architecture (runs whose model specs differ only in size keys: d_model, n_layers,
    heads, head_dim, hidden_dim), all in one log-log picture; 95% intervals by bootstrap over seeds. With a sweep
    file, --set/--steps/--seeds select the runs `archspec ablate` trained with the same options."""
    from rich.table import Table

    from archspec.ablate.scaling import X_NAMES, fit_groups, plot_fits, run_points
    from archspec.console import human, make_console
    from archspec.registry import Registry

    if (sweep is None) == (where is None):
        raise UserError("give a SWEEP (file or name) or --where FILTER, not both" if sweep else
                        "give a SWEEP (file or name) or --where FILTER")
    _check_by(by)
    registry = Registry(registry_url)
    rows, name = _source_rows(registry, sweep, where, overrides, steps, seeds)
    points, skipped = run_points(rows, by)
    if not points:
        shown = "; ".join(skipped[:5]) + ("; ..." if len(skipped) > 5 else "")
        raise UserError(f"{printable(name, 100)}: no finished run with a final val loss to fit ({shown})")
    fits = fit_groups(points, over=over, n_boot=n_boot)
    png = plot_fits(name, fits, (out_dir or Path("reports") / name) / f"{name}-scaling.png")
    if as_json:
        echo(json.dumps({"source": {"sweep": None if where else name, "where": where},
                               "registry": registry.url, "runs": len(points), "skipped": skipped,
                               "fits": [g.to_json() for g in fits], "png": str(png)}))
        return
    console = make_console(data=True)
    table = Table(title=f"scaling {name}: L = E + A·x^(−α), {len(points)} finished runs", title_justify="left")
    for col in ("group", "x", "sizes", "runs", "E", "95% CI", "A", "95% CI", "α", "95% CI"):
        table.add_column(col, justify="left" if col in ("group", "x") else "right", overflow="fold")
    for g in fits:
        r = g.result
        table.add_row(g.label, X_NAMES[g.over], str(len(g.sizes)), str(sum(len(s.runs) for s in g.sizes)),
                      _num(r.law.E), _interval(r, "E"), _num(r.law.A), _interval(r, "A"), f"{r.law.alpha:.4f}",
                      _interval(r, "alpha"))
    table.caption = (f"least squares on the seed means at each size; intervals: 95% percentile bootstrap over seeds "
                     f"({n_boot} replicates)")
    table.caption_justify = "left"
    console.print(table)
    for g in fits:
        sizes = Table(title=f"{g.label}", title_justify="left", box=None)
        for col in ("N" if g.over == "params" else "C", "tokens", "seeds", "mean loss", "min", "max", "fit"):
            sizes.add_column(col, justify="right")
        for s in g.sizes:
            sizes.add_row(human(s.x), human(s.tokens), str(len(s.runs)), f"{s.mean:.4f}", f"{min(s.losses):.4f}",
                          f"{max(s.losses):.4f}", f"{float(g.result.law(s.x)):.4f}")
        console.print(sizes)
        if g.result.note:
            console.print(f"note: {g.result.note}")
    if skipped:
        console.print(f"left out: {len(skipped)} run(s): " + "; ".join(skipped[:5]) + ("; ..." if len(skipped) > 5 else ""))
    console.print(f"plot: {png}")
