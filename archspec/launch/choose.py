"""Which launcher runs the jobs: the refusals made before anything is submitted (`check_launcher`, `check_detach`)
and the launcher itself (`make_launcher`: local processes, SLURM through submitit, or Ray). Apart from
archspec.launch.base, which the launchers import, so that no import runs in a circle.
"""

from __future__ import annotations

import shutil

from archspec.errors import UserError
from archspec.launch.base import Launcher
from archspec.launch.settings import LauncherSettings


def check_launcher(settings: LauncherSettings, registry_url: str) -> None:
    """The refusals made before anything is submitted, each a UserError (exit 2, one line)."""
    import importlib.util

    kind = settings.kind
    if kind in ("slurm", "slurm-local") and importlib.util.find_spec("submitit") is None:
        raise UserError(f"--launcher {kind} needs submitit: pip install 'archspec[slurm]'")
    if kind == "ray" and importlib.util.find_spec("ray") is None:
        raise UserError("--launcher ray needs ray: pip install 'archspec[ray]'")
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None] if kind == "slurm" else []
    if missing:
        raise UserError(f"--launcher slurm: no `{missing[0]}` on PATH, so no SLURM cluster to submit to from this "
                        "machine; run on a login node, or rehearse on this machine with --launcher slurm-local")
    if settings.multi_host and registry_url.startswith("sqlite"):
        where = "--launcher slurm" if kind == "slurm" else f"--launcher ray --ray-address {settings.ray_address}"
        raise UserError(f"{where}: workers may run on other hosts, and a SQLite file is not safe for many writers "
                        f"over a shared filesystem; use PostgreSQL: --registry postgresql://USER@HOST/DB")
    if kind != "slurm" and (settings.partition or settings.account or settings.qos or settings.sbatch):
        raise UserError(f"--partition/--account/--qos/--sbatch are SLURM options; --launcher {kind} takes none")
    if settings.sbatch:
        from archspec.launch.slurm import sbatch_options

        sbatch_options(settings.sbatch)  # a malformed option: refused now, before anything is recorded
    if kind != "ray" and settings.ray_address:
        raise UserError(f"--ray-address is an option of --launcher ray, not --launcher {kind}")


def check_detach(settings: LauncherSettings) -> None:
    """--detach leaves the jobs to a scheduler that outlives this command: SLURM's. slurm-local's jobs are this
    command's subprocesses, and a Ray task shares its driver's fate (it ends when the command does)."""
    if settings.kind != "slurm":
        raise UserError(f"--detach needs --launcher slurm (the jobs must outlive this command); under --launcher "
                        f"{settings.kind} they end with it: leave --detach out and the command waits")


def make_launcher(settings: LauncherSettings) -> Launcher:
    if settings.kind in ("slurm", "slurm-local"):
        from archspec.launch.slurm import SubmititLauncher

        return SubmititLauncher(settings)
    if settings.kind == "ray":
        from archspec.launch.ray import RayLauncher

        return RayLauncher(settings)
    from archspec.launch.local import LocalLauncher

    return LocalLauncher(settings)
