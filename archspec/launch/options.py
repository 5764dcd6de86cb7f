"""The launcher options of `archspec ablate` and `archspec train` (one decorator, one reader)."""

from __future__ import annotations

import click

from archspec.launch.settings import LAUNCHERS, LauncherSettings, merged


def _set_artifact_root(ctx, param, value):
    """--artifact-root sets $ARCHSPEC_ARTIFACT_ROOT for this command and the workers it starts, and gives the
    variable back as it was when the command ends (a refused value: at once, exit 2)."""
    if value is not None:
        import os

        from archspec.errors import UserError
        from archspec.registry.artifact_paths import ROOT_VAR, artifact_root

        before = os.environ.get(ROOT_VAR)

        def restore() -> None:
            if before is None:
                os.environ.pop(ROOT_VAR, None)
            else:
                os.environ[ROOT_VAR] = before

        os.environ[ROOT_VAR] = value
        try:
            artifact_root()  # an unusable value: exit 2 now
        except UserError:
            restore()
            raise
        ctx.call_on_close(restore)
    return value


def launcher_options(f):
    options = [
        click.option("--artifact-root", default=None, metavar="DIR", callback=_set_artifact_root, expose_value=False,
                     help="A shared filesystem path (each host may mount it elsewhere): artifacts under it are "
                          "recorded relative to it and resolved on read against the reader's own root "
                          "[default: $ARCHSPEC_ARTIFACT_ROOT]."),
        click.option("--launcher", type=click.Choice(LAUNCHERS), default=None,
                     help="Where runs train: this process (local, the default), SLURM (slurm: sbatch job arrays "
                          "through submitit; slurm-local: the same jobs as subprocesses here), or Ray (ray). "
                          "Also the sweep file's launcher: section."),
        click.option("--retries", type=click.IntRange(0, 100), default=None,
                     help="Resubmit a job whose process died up to N times (its run marked KILLED first) "
                          "[default: 1]."),
        click.option("--detach", is_flag=True,
                     help="With --launcher slurm: submit the jobs and return (prints the job ids and how to follow "
                          "them); without it the command waits for the last run."),
        click.option("--partition", default=None, help="SLURM partition."),
        click.option("--account", default=None, help="SLURM account."),
        click.option("--qos", default=None, help="SLURM quality of service."),
        click.option("--sbatch", "sbatch", multiple=True, metavar="--OPT=VALUE",
                     help="More sbatch options, e.g. --sbatch=--constraint=a100 (repeatable)."),
        click.option("--cpus-per-task", type=click.IntRange(1, 1024), default=None,
                     help="CPUs per job [default: 4 under SLURM, 1 under Ray]."),
        click.option("--gpus-per-task", type=click.IntRange(0, 64), default=None,
                     help="GPUs per job [default: 1 unless --device cpu]."),
        click.option("--time-min", type=click.IntRange(1, 525_600), default=None,
                     help="Time limit per job in minutes [default: 2 × the dry-run estimate + 10]."),
        click.option("--max-parallel", type=click.IntRange(1, 100_000), default=None,
                     help="Jobs running at once (SLURM array %N; slurm-local default 1; Ray: local cluster size)."),
        click.option("--ray-address", default=None, metavar="ADDRESS",
                     help="An existing Ray cluster (ray://head:10001, or auto); without it a local one is started."),
    ]
    for option in reversed(options):
        f = option(f)
    return f



def settings_from(params: dict, section: LauncherSettings | None = None, **more) -> LauncherSettings:
    """The settings a command's launcher options (and the sweep file's section under them) give."""
    from pydantic import ValidationError

    from archspec.errors import UserError

    try:
        return _merged(params, section, **more)
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(f"launcher option {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def _merged(params: dict, section: LauncherSettings | None, **more) -> LauncherSettings:
    return merged(section, kind=params.get("launcher"), retries=params.get("retries"),
                  partition=params.get("partition"), account=params.get("account"), qos=params.get("qos"),
                  sbatch=tuple(params.get("sbatch") or ()), cpus_per_task=params.get("cpus_per_task"),
                  gpus_per_task=params.get("gpus_per_task"), time_min=params.get("time_min"),
                  max_parallel=params.get("max_parallel"), ray_address=params.get("ray_address"), **more)
