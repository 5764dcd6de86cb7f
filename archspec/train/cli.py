"""`archspec train SPEC`: one run of a spec through the shared loop, recorded in the registry.

Under `torchrun --nproc-per-node N -m archspec.cli train SPEC ...` the same command trains with DDP.
"""

from __future__ import annotations

import click

from archspec.signals import install_signal_handlers
from archspec.spec import load_spec
from archspec.train.logger import FINISHED, NullLogger, RunLogger

DEVICES = ("auto", "cpu", "cuda")  # archspec.train.distributed.DEVICES, spelled here so --help needs no torch import


def make_logger(registry_url: str | None, rank: int = 0) -> RunLogger:
    """The registry at `registry_url` (default: $ARCHSPEC_REGISTRY, else sqlite:///registry/archspec.db), on rank 0.

    `archspec train` is an explicit request to train, so a run the registry already holds as FINISHED (same spec,
    data, recipe and seed) is trained again as a new attempt; sweeps (`archspec ablate`) skip those instead."""
    if rank != 0:
        return NullLogger()  # under torchrun only rank 0 records anything
    from archspec.registry import RegistryLogger, default_url

    return RegistryLogger(registry_url or default_url(), rerun_finished=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec_path", metavar="SPEC")
@click.option("--set", "overrides", multiple=True, metavar="K=V", help="Override a dotted spec key, e.g. train.lr=1e-3.")
@click.option("--steps", type=click.IntRange(min=1), help="Optimizer steps (overrides train.steps, so the schedule too).")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
              help="auto: CUDA when present, else CPU.")
@click.option("--resume", metavar="PATH", help="Continue from a checkpoint file or a run directory.")
@click.option("--registry", metavar="URL",
              help="Registry database URL [default: $ARCHSPEC_REGISTRY, else sqlite:///registry/archspec.db].")
@click.option("--run-dir", metavar="DIR",
              help="Where the generated module and checkpoint go [default: runs/<name>-<run id>].")
@click.option("--no-compile", is_flag=True, help="Skip per-block torch.compile (overrides train.compile).")
@click.option("--json", "json_out", is_flag=True, help="Print the final metrics as one JSON object on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or run lines on stderr.")
@click.option("--dry-run", is_flag=True,
              help="Print the memory plan (per-device bytes, whether it fits, the cheapest fix) and exit; exit 2 when "
                   "the run would not fit.")
@click.option("--world-size", type=click.IntRange(min=1), metavar="N",
              help="With --dry-run: plan for N processes [default: $WORLD_SIZE, else 1].")
def train_cmd(spec_path: str, overrides: tuple[str, ...], steps: int | None, device: str, resume: str | None,
              registry: str | None, run_dir: str | None, no_compile: bool, json_out: bool, quiet: bool,
              dry_run: bool, world_size: int | None) -> None:
    """Train SPEC once with the shared loop and record the run."""
    if world_size and not dry_run:
        raise click.UsageError("--world-size plans a run (--dry-run); a real run takes its world from torchrun")
    if dry_run:
        _dry_run(load_spec(spec_path, overrides), device, world_size, json_out)
        return
    # SIGTERM ends the run KILLED, like Ctrl-C, and exits 143. Installed first: a SIGTERM during the imports and
    # setup below (seconds, with torch) is not lost; the loop re-checks it before its first step.
    with install_signal_handlers():
        from archspec.train.checkpoint import resolve
        from archspec.train.distributed import world_env
        from archspec.train.loop import train  # torch: imported when a run starts, not for `archspec --help`

        _, rank, _ = world_env()  # inconsistent torchrun variables are refused before anything is built
        spec = load_spec(spec_path, overrides)
        if resume and not run_dir:
            run_dir = str(resolve(resume).parent)  # a resumed run keeps writing where it started
        result = train(spec, steps=steps, device=device, logger=make_logger(registry, rank), resume=resume,
                       run_dir=run_dir, compile=False if no_compile else None, json_out=json_out, progress=not quiet)
    if result.status != FINISHED:
        where = f"; last good checkpoint: {result.checkpoint}" if result.checkpoint else ""
        raise click.ClickException(f"run {result.run_id} {result.status}: {result.error}{where}")


def _dry_run(spec, device: str, world_size: int | None, json_out: bool) -> None:
    """The memory plan of the run this command would start, without starting it."""
    import json
    import os

    import torch

    from archspec.memory import planned, refusal

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    world = world_size or int(os.environ.get("WORLD_SIZE", "1") or 1)
    plan = planned(spec, device, training=True, world_size=world)
    click.echo(json.dumps(plan.to_dict(), sort_keys=True) if json_out else plan.render())
    if not plan.fits:
        raise refusal(spec, plan)
