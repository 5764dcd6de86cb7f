"""SLURM through submitit: `--launcher slurm` (sbatch, job arrays) and `--launcher slurm-local` (submitit's
LocalExecutor: the same pickled payload and worker in subprocesses of this machine, a rehearsal of a SLURM sweep).

`slurm` is `submitit.SlurmExecutor`, never `AutoExecutor`, which picks the local executor by itself when SLURM is
absent: a sweep meant for a cluster must not quietly train on the login node (archspec.launch.choose.check_launcher
refuses a machine without sbatch first). Jobs of the same resources go out as one job array (`executor.batch()`),
`--max-parallel` as its `%N` throttle. Each task asks for the GPUs, CPUs, memory and time of `resources_for`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from archspec.errors import UserError, printable
from archspec.launch.base import Died, Handle, Launcher, Payload, Resources, WorkerResult
from archspec.launch.settings import LauncherSettings
from archspec.launch.shell import script_value


def sbatch_options(extra: Sequence[str]) -> dict[str, object]:
    """`--constraint=a100`, `--exclusive`, `--mail-type END` → submitit's additional_parameters. The name must be a
    word and the value one line of text (archspec.launch.shell.script_value): submitit writes each as a `#SBATCH`
    line, the value shell-quoted."""
    out: dict[str, object] = {}
    for item in extra:
        script_value(item, "--sbatch")
        text = item.strip()
        if not text.startswith("--") or len(text) < 3:
            raise UserError(f"--sbatch {printable(repr(item), 80)}: expected an sbatch long option such as "
                            "--constraint=a100")
        key, sep, value = text[2:].partition("=")
        if not sep and " " in key:
            key, _, value = key.partition(" ")
            sep = " "
        if not key.replace("-", "").replace("_", "").isalnum() or not key.isascii():
            raise UserError(f"--sbatch {printable(repr(item), 80)}: {printable(repr(key), 40)} is not an sbatch "
                            "option name")
        if sep and not value.strip():
            raise UserError(f"--sbatch {printable(repr(item), 80)}: no value after {sep!r}")
        out[key.replace("-", "_")] = script_value(value.strip(), f"--sbatch --{key}") if sep else True
    return out


class SubmititLauncher(Launcher):
    def __init__(self, settings: LauncherSettings):
        super().__init__(settings)
        import submitit

        self.name = settings.kind
        folder = Path(script_value(settings.folder, "launcher folder")).absolute()
        self.folder = Path(script_value(str(folder), "launcher folder (absolute)")) / "%j"  # its #SBATCH --output
        if settings.kind == "slurm":
            self.executor = submitit.SlurmExecutor(folder=self.folder, max_num_timeout=0)
        else:
            self.executor = submitit.LocalExecutor(folder=self.folder, max_num_timeout=0)
        # slurm-local runs its jobs one at a time unless asked: like --launcher local, and a 2-core laptop is not
        # a cluster. SLURM's own queue decides for `slurm` (the array's %N when --max-parallel is given).
        self.parallel = settings.max_parallel or (1 if settings.kind == "slurm-local" else None)
        self._queue: list[Handle] = []

    def parameters(self, r: Resources) -> dict[str, object]:
        s = self.settings
        if s.kind == "slurm-local":
            return {"timeout_min": r.time_min, "gpus_per_node": r.gpus, "tasks_per_node": 1, "nodes": 1}
        params: dict[str, object] = {
            "job_name": "archspec", "time": r.time_min, "nodes": r.nodes, "ntasks_per_node": 1,
            "cpus_per_task": r.cpus, "mem": f"{r.mem_mb}MB", "signal_delay_s": 120,
        }
        if r.gpus:
            params["gpus_per_node"] = r.gpus
        for key in ("partition", "account", "qos"):
            if getattr(s, key):
                params[key] = script_value(getattr(s, key), f"--{key}", word=True)
        if self.parallel:
            params["array_parallelism"] = self.parallel
        extra = sbatch_options(s.sbatch)
        if extra:
            params["additional_parameters"] = extra
        return params

    def submit(self, payloads: Sequence[Payload]) -> list[Handle]:
        from archspec.launch.worker import run_payload

        handles = [Handle(p, "queued") for p in payloads]
        if self.settings.kind == "slurm-local":
            self._queue = list(handles)
            self._start_queued(running=0)
            return handles
        groups: dict[tuple, list[Handle]] = {}
        for h in handles:
            r = h.payload.resources
            groups.setdefault((r.gpus, r.cpus, r.mem_mb, r.time_min, r.nodes), []).append(h)
        for group in groups.values():
            self.executor.update_parameters(**self.parameters(group[0].payload.resources))
            with self.executor.batch():  # one job array per group of equal resources
                jobs = [self.executor.submit(run_payload, h.payload) for h in group]
            for h, job in zip(group, jobs):
                h.native, h.job_id = job, str(job.job_id)
        self._tidy_folder()
        return handles

    def _tidy_folder(self) -> None:
        """submitit makes the folder pattern itself (a literal `%j` directory) before each job's own folder: left
        empty, it is removed, so the launcher's folder holds one folder per job id and nothing else."""
        literal = self.folder
        try:
            if literal.is_dir() and not any(literal.iterdir()):
                literal.rmdir()
        except OSError:  # another submission is using it right now: left for the next
            pass

    def _start_queued(self, running: int) -> None:
        from archspec.launch.worker import run_payload

        while self._queue and (self.parallel is None or running < self.parallel):
            h = self._queue.pop(0)
            self.executor.update_parameters(**self.parameters(h.payload.resources))
            h.native = self.executor.submit(run_payload, h.payload)
            h.job_id = str(h.native.job_id)
            self.on_started(h)
            running += 1
        self._tidy_folder()

    def wait(self, handles: Sequence[Handle]) -> list[WorkerResult | Died]:
        results: dict[int, WorkerResult | Died] = {}
        while len(results) < len(handles):
            for i, h in enumerate(handles):
                if i in results or h.native is None or not h.native.done():
                    continue
                results[i] = self._outcome(h)
            running = sum(1 for i, h in enumerate(handles) if h.native is not None and i not in results)
            self._start_queued(running)
            if len(results) < len(handles):
                time.sleep(0.2)
        return [results[i] for i in range(len(handles))]

    def _outcome(self, h: Handle) -> WorkerResult | Died:
        try:
            out = h.native.result()
        except Exception as e:  # submitit: the job's process failed, was killed, timed out or was preempted
            lines = [line for line in str(e).strip().splitlines() if line.strip()]
            return Died(f"{type(e).__name__}: {lines[0][:200] if lines else ''}".rstrip(": "))
        if not isinstance(out, WorkerResult):
            return Died(f"the job returned {type(out).__name__}, not a result")
        out.scheduler_job = out.scheduler_job or h.job_id
        return out


def torchrun_setup(nodes: int, gpus_per_node: int, train_args: Sequence[str], port: int = 29500) -> list[str]:
    """The sbatch script's lines that start a multi-node `archspec train` under torchrun: one torchrun per node
    (the job's srun task), rendezvous at the allocation's first host on `port` (c10d), named by the job id."""
    import shlex

    # Only the two placeholders the node's shell must expand stay unquoted, chosen by position; every other word,
    # the user's --set values above all, is quoted by the script gate: it reaches `bash -c` on every node.
    def quoted(words) -> list[str]:
        return [script_value(str(a), "the multi-node torchrun command's argument", quote=True) for a in words]

    words = quoted(("torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(gpus_per_node), "--rdzv-backend",
                    "c10d", "--rdzv-endpoint"))
    words += ["$MASTER_ADDR:$MASTER_PORT", "--rdzv-id", "$SLURM_JOB_ID"]
    words += quoted(("-m", "archspec", "train", *train_args))
    line = " ".join(words)
    return ['export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            f"export MASTER_PORT={int(port)}",
            f"export ARCHSPEC_TORCHRUN={shlex.quote(line)}"]  # expanded by each node's task (bash -c)


def run_torchrun() -> int:
    """A multi-node job's task (one per node, through srun): the torchrun command the sbatch script exported, run with
    the node's own SLURM variables expanded. Its exit status is the task's."""
    import subprocess

    command = os.environ.get("ARCHSPEC_TORCHRUN")
    if not command:
        raise RuntimeError("ARCHSPEC_TORCHRUN is not set: this function runs inside archspec's sbatch script")
    done = subprocess.run(["bash", "-c", command], check=False)
    if done.returncode:
        raise RuntimeError(f"torchrun exited {done.returncode}")
    return 0
