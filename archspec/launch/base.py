"""The launcher contract: a sweep's jobs handed to processes the command does not run itself, their outcomes back.

A job travels as a `Payload`, plain data (a pickle of it holds no torch object, no open registry): the job's
canonical spec, its sweep membership, where to record (registry URL), how to train (device, compile, cache) and the
run id the submitting command computed. The worker (archspec.launch.worker) rebuilds the spec, prepares the same
build, refuses when its run id differs (another archspec version on the node would record another experiment), and
trains through the one loop. A `Launcher` submits payloads, returns one `Handle` per payload (its scheduler job id),
and waits for each: a `WorkerResult` when the worker returned, a `Died` when its process did not (killed, out of
memory, node lost). `launch` is the loop over attempts: a job that died is marked KILLED at once (the launcher
knows its process is gone; the heartbeat reaper would need heartbeat_timeout_s) and submitted again, up to
`retries` more times.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from archspec.launch.settings import LauncherSettings


@dataclass
class Resources:
    """What one job asks the scheduler for (from the memory plan and the dry-run estimate)."""

    gpus: int = 0
    cpus: int = 1
    mem_mb: int = 4096
    time_min: int = 60
    nodes: int = 1


@dataclass
class Payload:
    spec: dict[str, Any]  # archspec.spec.canonical_dict of the job's spec (seed applied)
    run_id: str  # the run id the submitting command computed (the build's experiment_id)
    registry_url: str
    device: str = "auto"
    compile: bool | None = None
    cache: str | None = None
    membership: dict[str, Any] | None = None  # archspec.train.logger.SweepMembership as a dict (None: not a sweep)
    label: str = ""
    workdir: str | None = None  # the submitting command's directory: runs/ lands there when the worker can reach it
    artifact_root: str | None = None
    log_to: list[str] | None = None
    attempt: int = 1  # the launcher's attempt (1: first submission)
    rerun_finished: bool = False  # `archspec train`: a FINISHED run is trained again as a repeat (sweeps skip it)
    resources: Resources = field(default_factory=Resources)


@dataclass
class WorkerResult:
    run_id: str
    status: str  # FINISHED | FAILED | KILLED | REFUSED (the worker would have trained another run id)
    error: str | None = None
    val_loss: float | None = None
    scheduler_job: str | None = None
    host: str = ""


@dataclass
class Died:
    """The worker's process ended without returning (SIGKILL, OOM, node failure, preemption)."""

    reason: str


@dataclass
class Handle:
    payload: Payload
    job_id: str  # the scheduler's id: SLURM job (or job_index), Ray task id, local pid
    native: Any = None  # submitit Job, Ray ObjectRef
    recorded: bool = False  # its job id is in the registry


class Launcher(ABC):
    name = "launcher"

    def __init__(self, settings: LauncherSettings):
        self.settings = settings
        self.env: dict[str, str] = {}  # what the jobs need in their environment beside the payload (worker_url)
        self.on_started: Callable[[Handle], None] = lambda handle: None  # a queued job started later (slurm-local)

    @abstractmethod
    def submit(self, payloads: Sequence[Payload]) -> list[Handle]:
        """Hand every payload to the scheduler; one handle each, in order."""

    @abstractmethod
    def wait(self, handles: Sequence[Handle]) -> list[WorkerResult | Died]:
        """Block until every handle's job has ended; its result, in order."""

    def close(self) -> None:
        """Release what the launcher started (a local Ray cluster)."""


def launch(launcher: Launcher, payloads: Sequence[Payload], registry, *, retries: int,
           on_event: Callable[[str], None] = lambda line: None) -> list[WorkerResult]:
    """Submit every payload and wait; a job whose process died is marked KILLED at once and submitted again, at most
    `retries` more times. Returns one result per payload, in order (a job that died every time: status KILLED)."""
    results: dict[int, WorkerResult] = {}
    pending = list(enumerate(payloads))
    for attempt in range(1, retries + 2):
        for _, p in pending:
            p.attempt = attempt
        handles = submit(launcher, [p for _, p in pending], registry, on_event)
        died = []
        for (i, p), h, outcome in zip(pending, handles, launcher.wait(handles)):
            if isinstance(outcome, Died):
                if registry.mark_killed(p.run_id, f"its job {h.job_id} ({launcher.name}) died: {outcome.reason}"):
                    on_event(f"{p.label} ({p.run_id}): job {h.job_id} died ({outcome.reason}); marked KILLED")
                else:
                    status = None if p.rerun_finished else registry.run_status(p.run_id)
                    if status in ("FINISHED", "FAILED"):  # it ended before its process did: never trained again
                        on_event(f"{p.label} ({p.run_id}): job {h.job_id} died ({outcome.reason}) after its run "
                                 f"ended {status}; not resubmitted")
                        results[i] = WorkerResult(p.run_id, status, None if status == "FINISHED" else
                                                  f"job {h.job_id} died after the run failed: {outcome.reason}",
                                                  scheduler_job=h.job_id)
                        continue
                    on_event(f"{p.label} ({p.run_id}): job {h.job_id} died ({outcome.reason})")
                died.append((i, p))
                results[i] = WorkerResult(p.run_id, "KILLED", f"job {h.job_id} died: {outcome.reason}",
                                          scheduler_job=h.job_id)
            else:
                results[i] = outcome
        pending = died
        if not pending:
            break
        if attempt <= retries:
            on_event(f"resubmitting {len(pending)} job(s) that died (retry {attempt} of {retries})")
    return [results[i] for i in range(len(payloads))]


def submit(launcher: Launcher, payloads: Sequence[Payload], registry, on_event=lambda line: None) -> list[Handle]:
    """Submit, recording each run's scheduler job id (the runs are SCHEDULED already: `schedule`)."""
    def record(h: Handle) -> None:
        if not h.recorded:
            registry.set_scheduler_job(h.payload.run_id, h.job_id)
            h.recorded = True
            on_event(f"{h.payload.label} ({h.payload.run_id}): submitted as {launcher.name} job {h.job_id}")

    launcher.on_started = record
    handles = launcher.submit(payloads)
    for h in handles:
        if h.native is not None:
            record(h)
    return handles


PASSWORD_VAR = "PGPASSWORD"


def worker_url(url: str) -> tuple[str, dict[str, str]]:
    """The registry URL a worker is handed, and the environment it needs beside it. A password never travels in a
    payload (pickled into the launcher's folder, often on a shared filesystem), on a command line or in an sbatch
    script: it is taken out of the URL and exported as PGPASSWORD (libpq's own variable, which psycopg reads when the
    URL has none; `with_password` puts it back for any other driver) to the jobs' environment only (`exported`):
    sbatch passes the submitting environment on (its default --export=ALL), submitit's local executor and a local
    Ray cluster inherit it (never a Ray runtime_env: Ray's agent logs its env_vars; a remote cluster's workers are
    told to take it from their own environment or a libpq password file). `url` must hold the password itself, not a
    redacted form (a Registry's `url` shows *** in its place: use its engine's URL)."""
    from sqlalchemy.engine import URL, make_url

    url = sqlite_absolute(url)
    if url.startswith("sqlite"):
        return url, {}
    parsed = make_url(url)
    in_query = parsed.query.get("password")  # libpq also takes ?password=...
    if isinstance(in_query, tuple):
        in_query = in_query[-1] if in_query else None
    password = parsed.password if parsed.password is not None else in_query
    if password is None:
        return url, {}
    bare = URL.create(parsed.drivername, parsed.username, None, parsed.host, parsed.port, parsed.database,
                      {k: v for k, v in parsed.query.items() if k != "password"})
    if str(password) == "***":
        raise ValueError("worker_url: given a redacted URL (its password is ***), not the one to connect with")
    return bare.render_as_string(hide_password=False), {PASSWORD_VAR: str(password)}


def with_password(url: str) -> str:
    """In a worker: its registry URL with the password its job's environment carries (PGPASSWORD) put back, when the
    URL has none; in memory only, so every driver (not libpq's alone) connects as the submitting command did."""
    password = os.environ.get(PASSWORD_VAR)
    if not password or url.startswith("sqlite"):
        return url
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.password is not None or "password" in parsed.query:
        return url
    return parsed.set(password=password).render_as_string(hide_password=False)


@contextmanager
def exported(env: dict[str, str]):
    """`env` in this process's environment while the block runs (jobs started in it inherit it), then as before."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def sqlite_absolute(url: str) -> str:
    """A SQLite URL with a relative path made absolute: a worker may start in another directory (Ray's do)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and ":memory:" not in url:
        return prefix + os.path.abspath(url[len(prefix):])
    return url
