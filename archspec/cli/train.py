"""`archspec train SPEC`: one run of a spec through the shared loop, recorded in the registry.

Under `torchrun --nproc-per-node N -m archspec train SPEC ...` the same command trains with DDP, or with FSDP2
when `train.parallel.kind` is `fsdp`.
"""

from __future__ import annotations

import functools
import os
import shlex

import click

from archspec.cli.options import device_option, eval_tokens_option, log_to_option, registry_option, set_option
from archspec.launch.options import launcher_options
from archspec.console import echo
from archspec.signals import install_signal_handlers, last_words
from archspec.spec import load_spec
from archspec.spec.train import MAX_STEPS
from archspec.train.logger import FINISHED, NullLogger, RunLogger


def make_logger(registry_url: str | None, rank: int = 0, take_over: bool = False,
                log_to: tuple[str, ...] | None = None) -> RunLogger:
    """The registry at `registry_url` (default: $ARCHSPEC_REGISTRY, else sqlite:///registry/archspec.db), on rank 0,
    fanned out to the sinks `log_to` (None: those of the run's `train.log_to`; archspec.train.sinks).

    `archspec train` is an explicit request to train, so a run the registry already holds as FINISHED (same spec,
    data, recipe and seed) is trained again as a new attempt; sweeps (`archspec ablate`) skip those instead."""
    if rank != 0:
        return NullLogger()  # under torchrun only rank 0 records anything
    from archspec.registry import RegistryLogger, default_url
    from archspec.train.sinks import with_sinks

    return with_sinks(RegistryLogger(registry_url or default_url(), rerun_finished=True, take_over=take_over), log_to)


# Options a resume command leaves out: the checkpoint brings the run directory and the starting weights, and the rest
# are about starting (take over a dead writer) or not training at all (dry run).
_NOT_REPEATED = {"spec_path", "resume", "run_dir", "init_from", "take_over", "dry_run", "world_size",
                 "launcher", "detach", "nodes"}


def resume_command(ctx: click.Context, checkpoint) -> str:
    """The command that continues an interrupted `archspec train` from its checkpoint: the same spec and every option
    the run was started with (read from the command's own parameters, so a new option is repeated too)."""
    from archspec.console import program

    args = ["train", os.path.abspath(str(ctx.params["spec_path"]))]  # works from any directory
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in _NOT_REPEATED:
            continue
        value, flag = ctx.params.get(param.name), max(param.opts, key=len)
        if param.is_flag:
            args += [flag] if value else []
        elif param.multiple:
            args += [a for v in value or () for a in (flag, str(v))]
        elif value is not None and value != param.default:
            args += [flag, str(value)]
    return program() + " " + shlex.join([*args, "--resume", str(checkpoint)])  # the program as it was invoked


def _resume_line(ctx: click.Context, signum: int, notes: dict) -> None:
    """A forced stop's last words (archspec.signals; on the watchdog's thread, so the context is passed in): the
    command that continues from the latest checkpoint."""
    checkpoint = notes.get("checkpoint")
    echo("resume with: " + resume_command(ctx, checkpoint) if checkpoint is not None else
         "no checkpoint was saved before the stop; nothing to resume", err=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec_path", metavar="SPEC")
@set_option
@click.option("--steps", type=click.IntRange(1, MAX_STEPS),
              help="Optimizer steps (overrides train.steps, so the schedule too); the spec's train.eval_interval is "
                   "rescaled to keep its number of evaluations (unless --set gives one).")
@eval_tokens_option
@device_option
@click.option("--resume", metavar="PATH", help="Continue from a checkpoint file or a run directory.")
@click.option("--init-from", metavar="CHECKPOINT",
              help="Start from these weights (from `archspec import-hf --checkpoint`, or a run's checkpoint) instead "
                   "of a fresh init: fine-tuning. The weights' architecture must be the spec's.")
@registry_option
@log_to_option
@click.option("--run-dir", metavar="DIR",
              help="Where the generated module and checkpoint go [default: runs/<name>-<run id>].")
@click.option("--no-compile", is_flag=True, help="Train eager: train.compile=none, whatever the spec says.")
@click.option("--json", "json_out", is_flag=True, help="Print the final metrics as one JSON object on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or run lines on stderr.")
@click.option("--dry-run", is_flag=True,
              help="Print the memory plan (per-device bytes, whether it fits, the cheapest fix) and exit; exit 2 when "
                   "the run would not fit.")
@click.option("--world-size", type=click.IntRange(1, 1 << 20), metavar="N",
              help="With --dry-run: plan for N processes [default: $WORLD_SIZE, else 1].")
@click.option("--take-over", is_flag=True,
              help="The run is recorded RUNNING but its process is dead (kill -9 on another machine): start anyway. "
                   "On this host a dead writer is recognised by its pid without this flag.")
@launcher_options
@click.option("--nodes", type=click.IntRange(1, 4096), default=None,
              help="With --launcher slurm: one job of N nodes running torchrun (--gpus-per-task processes a node).")
def train_cmd(spec_path: str, overrides: tuple[str, ...], steps: int | None, eval_tokens: int | None, device: str,
              resume: str | None,
              init_from: str | None,
              registry_url: str | None, log_to: str | None, run_dir: str | None, no_compile: bool, json_out: bool,
              quiet: bool,
              dry_run: bool, world_size: int | None, take_over: bool, nodes: int | None = None, **launch) -> None:
    """Train SPEC once with the shared loop and record the run."""
    overrides = (*overrides, *observation_overrides(spec_path, overrides, steps, eval_tokens))
    if launch.get("launcher") not in (None, "local") or nodes:
        _launched(spec_path, overrides, steps, device, registry_url, no_compile, nodes, launch,
                  resume=resume, init_from=init_from, run_dir=run_dir, dry_run=dry_run)
        return
    if world_size and not dry_run:
        raise click.UsageError("--world-size plans a run (--dry-run); a real run takes its world from torchrun")
    if dry_run:
        _dry_run(load_spec(spec_path, overrides), device, world_size, json_out)
        return
    # SIGTERM ends the run KILLED, like Ctrl-C, and exits 143. Installed first: a SIGTERM during the imports and
    # setup below (seconds, with torch) is not lost; the loop re-checks it before its first step.
    try:
        with install_signal_handlers(), last_words(functools.partial(_resume_line, click.get_current_context())):
            result = _train(spec_path, overrides, steps, device, resume, registry_url, run_dir, no_compile, json_out,
                            quiet, take_over, init_from, log_to)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the run ended KILLED; say how to continue it
        checkpoint = getattr(e, "checkpoint", None)
        if checkpoint is not None:
            echo("resume with: " + resume_command(click.get_current_context(), checkpoint), err=True)
        else:
            echo("no checkpoint was saved (stopped before the first step, or under several processes); "
                       "nothing to resume", err=True)
        raise
    if result.nothing_to_do:
        echo(f"run {result.run_id} already FINISHED; nothing to resume", err=True)
        return
    if result.status != FINISHED:
        where = f"; last good checkpoint: {result.checkpoint}" if result.checkpoint else ""
        raise click.ClickException(f"run {result.run_id} {result.status}: {result.error}{where}")


def observation_overrides(spec_path: str, overrides: tuple[str, ...], steps: int | None,
                          eval_tokens: int | None) -> tuple[str, ...]:
    """The --set overrides `--steps` and `--eval-tokens` imply for how the run is observed (not its identity):
    `--eval-tokens N` is train.eval_tokens=N, and with `--steps N` a spec's own train.eval_interval is rescaled to keep
    its number of evaluations (archspec.spec.train.rescaled_interval); an interval given with --set is kept."""
    extra = [f"train.eval_tokens={eval_tokens}"] if eval_tokens is not None else []
    if steps is not None and not any(o.split("=", 1)[0].strip() == "train.eval_interval" for o in overrides):
        from archspec.spec.train import rescaled_interval

        t = load_spec(spec_path, overrides).train
        if t.eval_interval:
            extra.append(f"train.eval_interval={rescaled_interval(t.eval_interval, t.steps, steps)}")
    return tuple(extra)


def _launched(spec_path, overrides, steps, device, registry_url, no_compile, nodes, launch, **not_with) -> None:
    """`archspec train --launcher slurm|slurm-local|ray`: the run trained by the launcher's worker (archspec.launch)."""
    from archspec.console import make_console
    from archspec.errors import UserError
    from archspec.launch.options import settings_from
    from archspec.launch.train import launch_train
    from archspec.registry import default_url

    given = [f"--{k.replace('_', '-')}" for k, v in not_with.items() if v]
    if given:
        raise UserError(f"{given[0]} is not available with --launcher (the launcher's worker starts the run afresh)")
    if launch.get("launcher") in (None, "local"):
        raise UserError("--nodes needs --launcher slurm")
    settings = settings_from(launch, nodes=nodes)
    console = make_console(stderr=True)
    status = launch_train(settings, spec_path, overrides, steps, device, registry_url or default_url(), no_compile,
                          launch.get("detach", False), console.print)
    if status is None:
        from archspec.console import program

        echo(f"submitted; follow the run with: {program()} runs list"
             + (f" --registry {shlex.quote(registry_url)}" if registry_url else ""))


def _dry_run(spec, device: str, world_size: int | None, json_out: bool) -> None:
    """The memory plan of the run this command would start, without starting it."""
    import json

    import torch

    from archspec.memory import planned, refusal
    from archspec.cache import cache_dir
    from archspec.train.data import build_data
    from archspec.train.distributed import world_env

    env_world, rank, _ = world_env()  # the same checks of torchrun's variables as a real run
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    from archspec.train.mesh import Layout

    world = world_size or env_world
    layout = Layout.of(spec.train.parallel, world)  # tp · pp must divide the processes, ep the data-parallel size
    dp_rank = layout.coordinates(rank)["dp"] if world == env_world else 0
    build_data(spec, cache_dir(None), rank=dp_rank, world=layout.dp)  # the data checks too
    plan = planned(spec, device, training=True, world_size=world)
    split = _mtp_split(spec)  # multi-token prediction: the main model and the modules inference drops, apart
    if json_out:
        echo(json.dumps({**plan.to_dict(), **({"mtp_split": split} if split else {})}, sort_keys=True))
    else:
        echo(plan.render())
        if split:
            main, mtp = split["main"], split["mtp"]
            echo(f"main model: {main['params']:,} parameters ({main['active']:,} active), "
                 f"{main['flops_forward_per_token']:,} forward FLOPs/token; MTP modules (depth {spec.model.mtp.depth}, "
                 f"training only): {mtp['params']:,} parameters ({mtp['active']:,} active), "
                 f"{mtp['flops_forward_per_token']:,} forward FLOPs/token (the plan counts them)")
    if not plan.fits:
        raise refusal(spec, plan)


def _mtp_split(spec) -> dict | None:
    """The accounting of the main model and of its multi-token prediction modules (model.mtp), at train.seq_len."""
    if spec.model.mtp is None:
        return None
    from archspec.accounting import account

    d = account(spec, spec.train.seq_len).to_dict()
    return {"main": d["main"], "mtp": d["mtp"], "seq_len": spec.train.seq_len}


def _train(spec_path, overrides, steps, device, resume, registry_url, run_dir, no_compile, json_out, quiet,
           take_over=False, init_from=None, log_to=None):
    from archspec.train.checkpoint import resolve
    from archspec.train.distributed import world_env
    from archspec.train.checkpointer import check_start  # torch: imported when a run starts, not for --help
    from archspec.train.loop import train
    from archspec.train.sinks import parse_log_to, resolve_sinks

    check_start(resume, init_from)
    _, rank, _ = world_env()  # inconsistent torchrun variables are refused before anything is built
    spec = load_spec(spec_path, overrides)
    if resume and not run_dir:
        run_dir = str(resolve(resume).parent)  # a resumed run keeps writing where it started
    sinks = resolve_sinks(parse_log_to(log_to), [spec.train])  # a missing package: exit 2 before anything trains
    return train(spec, steps=steps, device=device, logger=make_logger(registry_url, rank, take_over, sinks),
                 resume=resume, run_dir=run_dir, compile=False if no_compile else None, json_out=json_out,
                 progress=not quiet, init_from=init_from)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--measure", is_flag=True,
              help="Measure the matmul rate again now and store it (run it when the machine is otherwise idle).")
@device_option
@click.option("--cache", "cache", metavar="DIR", help="Cache directory [default: $ARCHSPEC_CACHE, else ~/.cache/archspec (per user)].")
def peak_cmd(measure: bool, device: str, cache: str | None) -> None:
    """Show (or --measure) the FLOP/s ceiling that MFU is a fraction of.

    On CPU it is this machine's measured fp32 matmul rate, measured once and never rewritten by a run; on a known
    GPU, the datasheet bf16 peak."""
    import torch

    from archspec.cache import cache_dir
    from archspec.train.distributed import resolve_device
    from archspec.train.precision import autocast_dtype
    from archspec.train.throughput import measure_ceiling, peak_flops

    dev = resolve_device(device)
    dtype = autocast_dtype("auto", dev) or torch.float32
    if measure:
        import os

        entry = measure_ceiling(dev, dtype, cache_dir(cache))
        kept = "stored" if entry["latest"] >= entry["flops"] else (
            f"below the stored {entry['flops'] / 1e9:.1f} GFLOP/s, which stays: a ceiling only rises")
        echo(f"measured {entry['latest'] / 1e9:.1f} GFLOP/s now (load average {os.getloadavg()[0]:.2f}): {kept}")
    flops, source = peak_flops(dev, dtype, cache_dir(cache))
    echo(f"MFU ceiling: {flops / 1e9:.1f} GFLOP/s, {source}")
