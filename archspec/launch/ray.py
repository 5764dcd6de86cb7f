"""Ray: one `ray.remote` task per job, with the job's CPUs and GPUs as its resource request.

`--ray-address ray://head:10001` (or `auto`) joins an existing cluster, whose workers may be other hosts (so the
registry must be PostgreSQL: archspec.launch.choose.check_launcher); without it a local cluster is started with this
machine's CPUs (`--max-parallel` × CPUs per task when given), and stopped at the end. Ray runs a task with as many
threads as the CPUs it asked for (one by default), so its losses equal `--launcher local`'s within float rounding
(1e-5), not bitwise. Ray's own retries are off (max_retries=0): archspec.launch.base.launch retries a job whose
worker died, after marking its run KILLED.
"""

from __future__ import annotations

import os
from typing import Sequence

from archspec.errors import UserError
from archspec.launch.base import Died, Handle, Launcher, Payload, WorkerResult
from archspec.launch.settings import LauncherSettings


class RayLauncher(Launcher):
    name = "ray"

    def __init__(self, settings: LauncherSettings):
        super().__init__(settings)
        import ray

        self.ray = ray
        self.started_here = False
        if not ray.is_initialized():
            if settings.ray_address:
                ray.init(address=settings.ray_address, log_to_driver=False)
            else:
                cpus = os.cpu_count() or 1
                if settings.max_parallel:
                    cpus = settings.max_parallel * (settings.cpus_per_task or 1)
                ray.init(num_cpus=cpus, log_to_driver=False, include_dashboard=False)
            self.started_here = True  # inside `exported`: its workers inherit the jobs' environment (the password)
        total = ray.cluster_resources().get("CPU", 0)
        if (settings.cpus_per_task or 1) > total:
            raise UserError(f"--cpus-per-task {settings.cpus_per_task}: the Ray cluster has {total:g} CPUs")

    def submit(self, payloads: Sequence[Payload]) -> list[Handle]:
        from archspec.launch.worker import run_payload

        task = self.ray.remote(run_payload)
        handles = []
        if self.env and self.settings.ray_address:
            # Not sent as the tasks' runtime_env: Ray's runtime_env agent writes a task's env_vars, password and all,
            # into its log files. A local cluster's workers inherit this process's environment instead (it was
            # started inside archspec.launch.base.exported); a remote cluster's need it on their side.
            import warnings

            from archspec.errors import Caution

            warnings.warn(Caution(f"--ray-address {self.settings.ray_address}: the registry password is not sent to "
                                  "the cluster (Ray logs a task's environment); give its workers PGPASSWORD in "
                                  "their environment, or a libpq password file (~/.pgpass, or $PGPASSFILE)"))
        for p in payloads:
            ref = task.options(num_cpus=p.resources.cpus, num_gpus=p.resources.gpus, max_retries=0).remote(p)
            handles.append(Handle(p, ref.task_id().hex(), ref))
        return handles

    def wait(self, handles: Sequence[Handle]) -> list[WorkerResult | Died]:
        out: list[WorkerResult | Died] = []
        for h in handles:
            try:
                result = self.ray.get(h.native)
            except Exception as e:  # WorkerCrashedError, RayTaskError, node died, OOM kill
                lines = [line for line in str(e).strip().splitlines() if line.strip()]
                out.append(Died(f"{type(e).__name__}: {lines[0][:200] if lines else ''}".rstrip(": ")))
                continue
            result.scheduler_job = result.scheduler_job or h.job_id
            out.append(result)
        return out

    def close(self) -> None:
        if self.started_here:
            self.ray.shutdown()
