"""A sweep's jobs through a launcher: the step of archspec.ablate.runner that trains a job, when it is not this
process that trains it.

The runner decides what to train (FINISHED skipped, RUNNING elsewhere left alone, `--add-seeds`) and checks every
job's data and memory first; `launch_jobs` then records each job SCHEDULED with its sweep membership (so that
`archspec ablate --status` can say queued/running/finished/failed from the registry alone), asks for the resources
of `resources_for`, submits, and (unless detached) waits for the last run to end, retrying jobs whose process died.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from archspec.launch.base import Payload, Resources, launch, submit
from archspec.launch.choose import check_launcher, make_launcher
from archspec.launch.settings import LauncherSettings

NO_ESTIMATE_MIN = 240  # the time limit asked for when nothing is measured and no peak is known (say --time-min)
HOST_MEMORY_FACTOR = 2  # the host memory asked for: this × the planned peak of a step, at least MIN_MEM_MB
MIN_MEM_MB = 4096


def wants_gpu(settings: LauncherSettings, device: str) -> int:
    if settings.gpus_per_task is not None:
        return settings.gpus_per_task
    if device == "cpu":
        return 0
    if device == "cuda" or settings.kind == "slurm":
        return 1  # a SLURM node is asked for the GPU the run needs; `--device cpu` asks for none
    import torch

    return int(torch.cuda.is_available())


def resources_for(build, settings: LauncherSettings, device: str, measured: Sequence = (), peak: float | None = None,
                  ) -> Resources:
    """One job's request. GPUs: 1 unless --device cpu (or --gpus-per-task). CPUs: --cpus-per-task (4 under SLURM, 1
    under Ray). Memory: HOST_MEMORY_FACTOR × the memory plan's peak of a step (the plan the runner checked), at least
    MIN_MEM_MB. Time: --time-min, else time_margin × the dry-run estimate (archspec.ablate.estimate) + min_time_min,
    else NO_ESTIMATE_MIN."""
    from archspec.ablate.estimate import estimate, work_of

    t = build.spec.train
    if settings.time_min is not None:
        minutes = settings.time_min
    else:
        work = work_of(build.spec, build.accounting)
        est = estimate(build.model_hash, (build.view.sequences_per_replica, t.seq_len), work, list(measured), peak)
        minutes = (NO_ESTIMATE_MIN if est.seconds is None
                   else math.ceil(settings.time_margin * est.seconds / 60) + settings.min_time_min)
    plan_bytes = build.memory.total if build.memory is not None else 0
    mem_mb = max(MIN_MEM_MB, math.ceil(HOST_MEMORY_FACTOR * plan_bytes / 2**20))
    cpus = settings.cpus_per_task or (4 if settings.kind in ("slurm", "slurm-local") else 1)
    return Resources(gpus=wants_gpu(settings, device), cpus=cpus, mem_mb=mem_mb, time_min=int(minutes),
                     nodes=settings.nodes)


def scheduled_info(build, membership):
    """The RunInfo a SCHEDULED row is recorded with: what is known before the worker starts."""
    from archspec.spec import canonical_dict
    from archspec.train.logger import RunInfo

    spec = build.spec
    return RunInfo(spec_name=spec.name, model_hash=build.model_hash, spec_json=canonical_dict(spec), generated_hash="",
                   accounting={**build.accounting.to_dict(), "seq_len": spec.train.seq_len},
                   spec_accounting={**build.spec_accounting.to_dict(), "seq_len": spec.model.context_length},
                   data_hash=build.data.data_hash, seed=spec.train.seed, recipe=build.recipe, sweep=membership,
                   key=build.experiment_id)


def launch_jobs(settings: LauncherSettings, sweep, launched: Sequence[tuple[Any, str, str]], builds, registry, *,
                device: str, compile: bool | None, cache: str | Path | None, log_to: Sequence[str] | None = None,
                detach: bool = False, on_event: Callable[[str], None] = lambda line: None,
                make: Callable[[LauncherSettings], Any] = make_launcher) -> list:
    """Train `launched` ((job, run id, where) from the runner) through the launcher of `settings` (`make` builds it:
    archspec.launch.packed passes its own); JobOutcomes."""
    from archspec.ablate.estimate import measured_runs
    from archspec.ablate.runner import JobOutcome, membership
    from archspec.launch.base import exported, worker_url
    from archspec.spec import canonical_dict
    from archspec.cache import cache_dir

    # The password, if any, goes to the jobs' environment, not the payload. `registry.url` is for messages (its
    # password shown as ***); the URL the registry connects with is its engine's.
    url, secret = worker_url(registry.engine.url.render_as_string(hide_password=False))
    check_launcher(settings, url)
    device_type = "cpu" if device == "cpu" else ("cuda" if wants_gpu(settings, device) else "cpu")
    measured = measured_runs(registry, device_type, "auto") if settings.time_min is None else []
    payloads = []
    for job, run_id, where in launched:
        build = builds[job.key]
        m = membership(sweep, job)
        registry.schedule_run(scheduled_info(build, m))
        payloads.append(Payload(
            spec=canonical_dict(job.spec), run_id=run_id, registry_url=url, device=device, compile=compile,
            cache=str(cache_dir(cache)), membership=asdict(m), label=where, workdir=os.getcwd(),
            artifact_root=os.environ.get("ARCHSPEC_ARTIFACT_ROOT"), log_to=list(log_to) if log_to else None,
            resources=resources_for(build, settings, device, measured)))
    with exported(secret):
        launcher = make(settings)
        launcher.env = secret
        try:
            if detach:
                handles = submit(launcher, payloads, registry, on_event)
                return [JobOutcome(job, h.payload.run_id, "submitted", "SCHEDULED", None)
                        for (job, _, _), h in zip(launched, handles)]
            results = launch(launcher, payloads, registry, retries=settings.retries, on_event=on_event)
        finally:
            if not detach:
                launcher.close()
    outcomes = []
    for (job, run_id, where), r in zip(launched, results):
        outcomes.append(JobOutcome(job, r.run_id, "trained", r.status, r.error))
        on_event(f"{where}: {r.status}" + (f": {_first_line(r.error)}" if r.error else
                                           f", val loss {r.val_loss:.4f}" if r.val_loss is not None else "")
                 + (f" (job {r.scheduler_job} on {r.host})" if r.scheduler_job else ""))
    return outcomes


def _first_line(text: str | None) -> str:
    from rich.markup import escape

    from archspec.errors import printable

    return escape(printable((text or "").strip().splitlines()[0] if text and text.strip() else "", 300))




class LaunchRequest:
    """What `archspec ablate --launcher ...` hands the sweep runner (archspec.ablate.runner.run_jobs(launcher=...)):
    the launcher's settings, the sinks, and whether to wait."""

    def __init__(self, settings: LauncherSettings, log_to: Sequence[str] | None = None, detach: bool = False):
        self.settings, self.log_to, self.detach = settings, log_to, detach

    def device_type(self, device: str) -> str:
        """The device type the workers train on, which the runner plans memory for: a SLURM node's GPU though the
        login node has none (a plan for absent hardware checks nothing but what is known)."""
        return "cuda" if wants_gpu(self.settings, device) else "cpu"

    def prepare(self, builds, device: str, on_event: Callable[[str], None]) -> "LaunchRequest":
        """Called by the runner once every build is checked (archspec.launch.packed.PackedRequest decides then)."""
        return self

    def run(self, sweep, launched, builds, registry, *, device: str, compile: bool | None, cache,
            on_event: Callable[[str], None]) -> list:
        return launch_jobs(self.settings, sweep, launched, builds, registry, device=device, compile=compile,
                           cache=cache, log_to=self.log_to, detach=self.detach, on_event=on_event)
