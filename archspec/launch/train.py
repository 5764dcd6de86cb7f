"""`archspec train SPEC --launcher slurm|slurm-local|ray`: one run, trained by a launcher's worker.

One node: the same payload and worker as a sweep's job (archspec.launch.worker), with `archspec train`'s rule that
a FINISHED run is trained again as a repeat. Several nodes (`--nodes N`, SLURM only): one job of N nodes whose
sbatch script exports the torchrun command (archspec.launch.slurm.torchrun_setup) that each node's task runs —
`torchrun --nnodes N --nproc-per-node G ... -m archspec train SPEC ...` with the rendezvous at the allocation's first
host — so the run is DDP/FSDP over N × G processes, recorded by rank 0 like any torchrun run.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from archspec.errors import UserError
from archspec.launch.settings import LauncherSettings


def train_args(spec_path: str, overrides: Sequence[str], steps: int | None, registry_url: str, no_compile: bool,
               device: str) -> list[str]:
    args = [os.path.abspath(spec_path), *(a for o in overrides for a in ("--set", o)), "--registry", registry_url,
            "--quiet"]
    if steps:
        args += ["--steps", str(steps)]
    if no_compile:
        args.append("--no-compile")
    if device != "auto":
        args += ["--device", device]
    return args


def launch_train(settings: LauncherSettings, spec_path: str, overrides: Sequence[str], steps: int | None,
                 device: str, registry_url: str, no_compile: bool, detach: bool,
                 on_event: Callable[[str], None]) -> str | None:
    """Train one run through the launcher; the run's final status (None when detached). Exit-2 problems raise."""
    from archspec.launch.base import Payload, exported, launch, sqlite_absolute, submit, worker_url
    from archspec.launch.choose import check_detach, check_launcher, make_launcher
    from archspec.launch.sweeps import resources_for, scheduled_info
    from archspec.registry import Registry
    from archspec.spec import canonical_dict, load_spec
    from archspec.cache import cache_dir
    from archspec.train.data import build_data
    from archspec.train.build import prepare
    from archspec.train.loop import with_steps

    url = sqlite_absolute(registry_url)  # this command's own (password included)
    job_url, secret = worker_url(registry_url)  # the jobs': the password goes to their environment (worker_url)
    check_launcher(settings, job_url)
    if detach:
        check_detach(settings)
    spec = load_spec(spec_path, overrides)
    if steps:
        spec = with_steps(spec, steps)
    if settings.nodes > 1:
        if settings.kind != "slurm":
            raise UserError(f"--nodes {settings.nodes}: several nodes need --launcher slurm "
                            "(torchrun in the allocation)")
        with exported(secret):
            return _multi_node(settings, spec_path, overrides, steps, device, job_url, no_compile, detach, on_event)
    build = prepare(spec, build_data(spec, cache_dir(None), rank=0, world=1))
    if device == "auto":
        import torch

        device_type = "cuda" if settings.kind == "slurm" or torch.cuda.is_available() else "cpu"
    else:
        device_type = device
    build = build.checked(device_type)  # the plan is the memory request; a run that cannot fit is refused here
    registry = Registry(url)
    registry.schedule_run(scheduled_info(build, None))
    payload = Payload(spec=canonical_dict(spec), run_id=build.experiment_id, registry_url=job_url, device=device,
                      compile=False if no_compile else None, cache=str(cache_dir(None)), label=spec.name,
                      workdir=os.getcwd(), artifact_root=os.environ.get("ARCHSPEC_ARTIFACT_ROOT"),
                      rerun_finished=True, resources=resources_for(build, settings, device))
    with exported(secret):
        launcher = make_launcher(settings)
        launcher.env = secret
        try:
            if detach:
                submit(launcher, [payload], registry, on_event)
                return None
            (result,) = launch(launcher, [payload], registry, retries=settings.retries, on_event=on_event)
        finally:
            if not detach:
                launcher.close()
    # the run id was said once, at submission ("<name> (<run id>): submitted as ... job N"): not again here
    on_event(f"{spec.name}: {result.status}" + (f": {result.error.splitlines()[0]}" if result.error else "")
             + (f" (job {result.scheduler_job} on {result.host})" if result.scheduler_job else ""))
    if result.status != "FINISHED":
        first = (result.error or "").strip().splitlines()
        raise UserError(f"run {result.run_id} {result.status}" + (f": {first[0]}" if first else ""))
    return result.status


def _multi_node(settings, spec_path, overrides, steps, device, url, no_compile, detach, on_event) -> str | None:
    import submitit

    from archspec.launch.slurm import SubmititLauncher, run_torchrun, torchrun_setup

    gpus = settings.gpus_per_task if settings.gpus_per_task is not None else 1
    if url.startswith("sqlite"):
        raise UserError("--nodes: a torchrun job across nodes needs PostgreSQL: --registry postgresql://...")
    launcher = SubmititLauncher(settings)
    params = launcher.parameters(_node_resources(settings, gpus))
    params["setup"] = torchrun_setup(settings.nodes, max(gpus, 1), train_args(spec_path, overrides, steps, url,
                                                                                no_compile, device))
    launcher.executor.update_parameters(**params)
    job = launcher.executor.submit(run_torchrun)
    on_event(f"submitted {settings.nodes}-node torchrun job {job.job_id}")
    if detach:
        return None
    try:
        job.result()
    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as e:
        raise UserError(f"torchrun job {job.job_id} failed: {str(e).strip().splitlines()[0] if str(e).strip() else e}")
    return "FINISHED"


def _node_resources(settings: LauncherSettings, gpus: int):
    from archspec.launch.base import Resources

    cpus = settings.cpus_per_task or 4 * max(gpus, 1)
    return Resources(gpus=gpus, cpus=cpus, mem_mb=max(16_384, 16_384 * gpus), time_min=settings.time_min or 240,
                     nodes=settings.nodes)


__all__ = ["launch_train", "train_args"]
