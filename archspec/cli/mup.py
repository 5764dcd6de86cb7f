"""`archspec mup-check SPEC`: µP's coordinate check, the command over archspec.ablate.mup."""

from __future__ import annotations

import json
from pathlib import Path

import click

from archspec.cli.options import set_option
from archspec.console import echo
from archspec.errors import UserError


def _widths(ctx, param, value: str):
    from archspec.ablate.mup import parse_widths

    try:
        return parse_widths(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path))
@set_option
@click.option("--widths", default="64,128,256,512", show_default=True, callback=_widths, metavar="W,W,...",
              help="d_model of each run (at least two); every inner width scales with it, head counts stay.")
@click.option("--steps", type=click.IntRange(2, 1000), default=10, show_default=True,
              help="Training steps at each width, at the spec's train.lr held constant.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=8, show_default=True,
              help="Sequences per step.")
@click.option("--seq-len", type=click.IntRange(2, 1 << 16), default=64, show_default=True,
              help="Tokens per sequence (at most the model's context_length).")
@click.option("--both", is_flag=True,
              help="Also run the other parametrization (standard beside mup), for the table and the plot; the "
                   "verdict stays the spec's own.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PNG",
              help="Write the RMS-vs-width picture here.")
@click.option("--json", "as_json", is_flag=True, help="Print the check as one JSON object on stdout.")
def mup_check_cmd(spec_path: Path, overrides: tuple[str, ...], widths: list[int], steps: int, batch_size: int,
                  seq_len: int, both: bool, plot_path: Path | None, as_json: bool) -> None:
    """µP's coordinate check: train SPEC a few steps at each width and show how activation scales grow with width.

    Records the RMS of the embedding output, each block's output and the logits at every step, and fits the slope of
    log(RMS) against log(width) at the last one. Exit 0 and "flat" when every |slope| is within the bound
    (archspec.ablate.mup.SLOPE_BOUND), else exit 1 naming the coordinates that grow (or shrink). Under model.parametrization:
    mup they stay flat; under standard the logits and blocks grow with the width (which is what the check is for).
    Runs on the CPU through the shared loop; nothing is recorded."""
    from rich.table import Table

    from archspec.ablate.mup import SLOPE_BOUND, coordinate_check, plot_checks, widened
    from archspec.console import make_console
    from archspec.spec import load_spec

    if plot_path is not None and plot_path.exists() and not plot_path.is_file():  # a FIFO or a device: never opened
        raise UserError(f"--plot {plot_path}: not a regular file; give a path for the PNG")
    spec = load_spec(spec_path, overrides)
    own = spec.model.parametrization
    order = [own] + ([("standard" if own == "mup" else "mup")] if both else [])
    if "mup" in order and spec.train.optimizer.kind == "muon":  # (a muon spec with mup itself is refused at load)
        raise UserError("--both: µP (model.parametrization: mup) is not built with train.optimizer muon, which "
                        "scales each matrix's update by its own rule (adjust_lr_fn); drop --both, or use optimizer "
                        "adamw")
    for p in order:  # every width of every run checked before any trains
        for w in widths:
            widened(spec, w, p)
    from archspec.console import Tracker

    with Tracker("mup-check", total=len(order) * len(widths) * steps) as tracker:  # training steps, on stderr
        checks = {p: coordinate_check(spec, widths, steps=steps, batch_size=batch_size, seq_len=seq_len,
                                      parametrization=p, tracker=tracker) for p in order}
    png = plot_checks([checks[p] for p in sorted(order, key=lambda p: p != "standard")], plot_path) \
        if plot_path is not None else None
    verdict = checks[own]
    not_flat = verdict.not_flat()
    if as_json:
        echo(json.dumps({"flat": not not_flat, "not_flat": not_flat, "slope_bound": SLOPE_BOUND,
                         "checks": [checks[p].to_json() for p in order], "plot": str(png) if png else None}))
        if not_flat:
            raise click.exceptions.Exit(1)
        return
    console = make_console(data=True)
    for p in order:
        check = checks[p]
        slopes, at_init = check.slopes(), check.slopes(0)
        table = Table(title=f"{spec.name}, {p}: activation RMS at step {steps} of {steps} (lr {spec.train.lr:g}, "
                            f"{batch_size}×{min(seq_len, spec.model.context_length)} tokens a step)",
                      title_justify="left")
        table.add_column("coordinate")
        for w in widths:
            table.add_column(f"d={w}", justify="right")
        table.add_column("slope", justify="right")
        table.add_column("at init", justify="right")
        table.add_column("", justify="left")
        for c in check.coordinates:
            table.add_row(c, *(f"{v:.4g}" for v in check.at(c)), f"{slopes[c]:+.3f}", f"{at_init[c]:+.3f}",
                          check.trend(c))
        table.add_row("train loss", *(f"{losses[-1]:.4f}" for losses in check.losses), "", "", "")
        table.caption = f"slope: d log(RMS) / d log(width), least squares; flat: |slope| <= {SLOPE_BOUND}"
        table.caption_justify = "left"
        console.print(table)
    if png is not None:
        console.print(f"plot: {png}")
    if not_flat:
        console.print(f"not flat ({own}): " + ", ".join(f"{c} {verdict.trend(c)} with the width (slope "
                                                         f"{verdict.slopes()[c]:+.2f})" for c in not_flat))
        raise click.exceptions.Exit(1)
    console.print(f"flat ({own}): every |slope| <= {SLOPE_BOUND}")

