"""What a launcher's worker process runs: one payload (archspec.launch.base.Payload) through the one loop.

    run_payload(payload) -> WorkerResult

It rebuilds the spec from its canonical dict, prepares the build (archspec.train.build) over the data (tokenised
into the payload's cache, or found there), and refuses to train when the build's run id is not the one the
submitting command computed: another archspec version on the node, or other data under the same path, would record
another experiment than the sweep planned. It then trains through `archspec.train.loop.train` into the registry,
as a member of its sweep, and records its scheduler job id (`runs.scheduler_job`).

A training failure (a non-finite loss, a data error) is the run's FAILED status, returned. A signal (SLURM's
SIGTERM before preemption, scancel) ends the run KILLED and is raised again: the launcher sees the job die and
resubmits it within its retries.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import replace
from typing import Any

from archspec.launch.base import Payload, WorkerResult, with_password

# Test-only: a worker whose launch attempt equals this kills itself (SIGKILL) at its first metrics write, so that
# tests can check that a job dying mid-run is marked KILLED and retried. 0 (unset): never.
DIE_ON_ATTEMPT_VAR = "ARCHSPEC_TEST_DIE_ON_ATTEMPT"


class MemberLogger:
    """Forwards to a RunLogger, recording the run as a member of its sweep (like archspec.ablate.runner.SweepLogger,
    from plain data) and its scheduler job id once the run exists."""

    def __init__(self, inner, membership, scheduler_job: str | None, die_on_first_metrics: bool = False):
        self.inner, self.membership, self.scheduler_job = inner, membership, scheduler_job
        self.die_on_first_metrics = die_on_first_metrics

    def start(self, info):
        run_id = self.inner.start(replace(info, sweep=self.membership) if self.membership else info)
        inner = getattr(self.inner, "inner", None)  # under the sinks' fan-out (archspec.train.sinks.SinkLogger)
        registry = getattr(self.inner, "registry", None) or getattr(inner, "registry", None)
        if registry is not None and self.scheduler_job:
            registry.set_scheduler_job(run_id, self.scheduler_job)
        return run_id

    def log_metrics(self, step, metrics):
        self.inner.log_metrics(step, metrics)
        if self.die_on_first_metrics:
            os.kill(os.getpid(), signal.SIGKILL)  # the run is RUNNING in the registry: what a killed job leaves

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def scheduler_job_id() -> str | None:
    """This process's job as the scheduler names it: SLURM's array task (`1234_3`) or job (`1234`), Ray's task id."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"]
    if env.get("SUBMITIT_EXECUTOR") == "local":
        import submitit

        return str(submitit.JobEnvironment().job_id)
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_task_id()
    except Exception:  # no ray, or not inside a task
        pass
    return None


def run_payload(payload: Payload) -> WorkerResult:
    from archspec.environment import env_int
    from archspec.errors import UserError
    from archspec.registry import RegistryLogger
    from archspec.spec import load_spec_dict
    from archspec.train.build import prepare
    from archspec.cache import cache_dir
    from archspec.train.data import build_data
    from archspec.train.logger import SweepMembership
    from archspec.train.loop import train
    from archspec.train.report import code_version
    from archspec.train.sinks import with_sinks

    host = socket.gethostname()
    if payload.workdir and os.path.isdir(payload.workdir):
        os.chdir(payload.workdir)  # runs/<name>-<id> lands where the submitting command would have put it
    if payload.artifact_root:
        os.environ.setdefault("ARCHSPEC_ARTIFACT_ROOT", payload.artifact_root)
    job = scheduler_job_id()
    try:
        spec = load_spec_dict(payload.spec, origin=f"job {payload.label or payload.run_id}")
        build = prepare(spec, build_data(spec, cache_dir(payload.cache), rank=0, world=1))
        if build.experiment_id != payload.run_id:
            return WorkerResult(payload.run_id, "REFUSED", (
                f"this worker (archspec {code_version() or 'unknown version'} on {host}) computes run id "
                f"{build.experiment_id} for the job, not {payload.run_id} as the submitting command did: another "
                "archspec version or other data on this node; install the same archspec on every node"),
                scheduler_job=job, host=host)
        die = env_int(DIE_ON_ATTEMPT_VAR, 0, 0, 1000) == payload.attempt
        membership = SweepMembership(**payload.membership) if payload.membership else None
        logger = MemberLogger(with_sinks(RegistryLogger(with_password(payload.registry_url),
                                                        rerun_finished=payload.rerun_finished),
                                         payload.log_to), membership, job,
                              die_on_first_metrics=die)
        # progress on: the job's log (its stderr) holds the run's own lines, its evaluations and its closing line
        result = train(spec, device=payload.device, logger=logger, compile=payload.compile, progress=True,
                       cache=payload.cache, build=build)
    except UserError as e:  # a data or registry problem: nothing trained (RUNNING elsewhere is one)
        return WorkerResult(payload.run_id, "REFUSED", e.render(), scheduler_job=job, host=host)
    return WorkerResult(result.run_id, result.status, result.error, result.metrics.get("val_loss"),
                        scheduler_job=job, host=host)
