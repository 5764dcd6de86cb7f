"""Several runs per device: `archspec ablate SWEEP --jobs-per-device N|auto`.

A small model leaves a GPU mostly idle; N runs of a sweep trained at once on it use what one leaves. Each job is its
own process (`python -m archspec.launch.packed PAYLOAD RESULT`): the launcher contract's payload (archspec.launch.base)
written as JSON, run through the same worker as every launcher (archspec.launch.worker.run_payload: its own registry
row, its own seed, the run id the sweep computed), its result written back as JSON. Nothing that changes a result is
shared: the processes share only the data cache the runner filled before any of them started (read-only from then on)
and the registry they each write their own row to.

`run_packed` is the scheduling, apart from processes so that it is tested with fake jobs: each job goes to a free
slot (slots are device × N; a job takes the device with the fewest running), never more than N at once per device, a
job that fails or dies does not stop the others, and an interruption (Ctrl-C, SIGTERM: archspec.signals.Terminated)
sends SIGTERM to every running child, waits for them (each ends its run KILLED, archspec.signals), kills those still
there after STOP_WAIT_S, and is raised again.

`jobs_per_device("auto", ...)`: on CUDA the largest job's memory plan (archspec.memory, the peak of a step) plus a CUDA
context per process against the least free memory of the devices, at most MAX_JOBS_PER_DEVICE; on CPU 1, since the
runs would share the same cores and one run already uses them all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence, TypeVar

from archspec.launch.base import Died, Handle, Launcher, Payload, Resources, WorkerResult
from archspec.launch.settings import LauncherSettings

MAX_JOBS_PER_DEVICE = 8  # auto never packs more: beyond it a CUDA device's launch queue, not memory, is the limit
CONTEXT_BYTES = 1 << 30  # what each process costs a GPU beyond its plan: the CUDA context and the kernels it loads
STOP_WAIT_S = 15.0  # after SIGTERM, how long the children get to end their runs KILLED before SIGKILL (< STOP_GRACE_S)
POLL_S = 0.2


# ── how many ────────────────────────────────────────────────────────────────────────────────────────────────────────


def parse_jobs_per_device(text: str) -> int | str:
    """`auto` or a whole number 1..MAX: what --jobs-per-device takes (ValueError with the reason otherwise)."""
    value = text.strip().lower()
    if value == "auto":
        return "auto"
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise ValueError(f"expected auto or a whole number from 1 to 64, got {text!r}")
    return int(value)


def jobs_per_device(requested: int | str, device_type: str, plan_bytes: Sequence[int],
                    free_bytes: Sequence[int] = ()) -> tuple[int, str]:
    """(jobs per device, why). `requested` a number: itself. `auto`: 1 on CPU; on CUDA as many processes as the least
    free memory over `free_bytes` (one figure per device) holds at the largest plan in `plan_bytes` plus
    CONTEXT_BYTES each, at least 1, at most MAX_JOBS_PER_DEVICE."""
    if requested != "auto":
        return int(requested), f"--jobs-per-device {requested}"
    if device_type != "cuda":
        return 1, ("--jobs-per-device auto = 1 on CPU: packed runs would share the same cores, which one run "
                   "already uses (give a number to pack anyway)")
    if not free_bytes:
        return 1, "--jobs-per-device auto = 1: no CUDA device's free memory is known"
    per_job = max(plan_bytes, default=0) + CONTEXT_BYTES
    fits = min(free_bytes) // per_job
    n = max(1, min(MAX_JOBS_PER_DEVICE, fits))
    return n, (f"--jobs-per-device auto = {n}: {min(free_bytes) / 2**30:.1f} GiB free per device holds {fits} job(s) "
               f"of {per_job / 2**30:.2f} GiB (the largest plan + {CONTEXT_BYTES / 2**30:.0f} GiB CUDA context), "
               f"at most {MAX_JOBS_PER_DEVICE}")


def cuda_free_bytes() -> list[int]:
    """Free memory of each visible CUDA device (the caching allocator's margin applied: archspec.memory)."""
    import torch

    from archspec.memory import CUDA_MARGIN

    if not torch.cuda.is_available():
        return []
    return [int(torch.cuda.mem_get_info(i)[0] * CUDA_MARGIN) for i in range(torch.cuda.device_count())]


# ── the scheduling ──────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Slot:
    device: str | None  # the CUDA device index the job is pinned to (CUDA_VISIBLE_DEVICES), None on CPU
    index: int  # the slot's number on its device, 0..N-1


class Child(Protocol):
    """A started job: `poll()` its outcome (None while it runs), `terminate()` asks it to stop, `kill()` ends it."""

    def poll(self) -> WorkerResult | Died | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


J = TypeVar("J")


def slots_for(devices: Sequence[str | None], per_device: int) -> list[Slot]:
    return [Slot(d, k) for d in devices for k in range(per_device)]


def run_packed(jobs: Sequence[J], slots: Sequence[Slot], start: Callable[[J, Slot], Child], *,
               pause: Callable[[], None] = lambda: time.sleep(POLL_S), stop_wait_s: float = STOP_WAIT_S,
               on_start: Callable[[J, Slot, Child], None] = lambda job, slot, child: None) -> list[WorkerResult | Died]:
    """Run every job on the slots, at most one job per slot at a time; the outcomes in the jobs' order. A job whose
    start raises is Died with the reason; the others go on. An interruption stops every child (`stop_all`) and is
    raised again."""
    if not slots:
        raise ValueError("run_packed: no slots")
    outcomes: dict[int, WorkerResult | Died] = {}
    running: dict[int, tuple[Slot, Child]] = {}
    waiting = list(range(len(jobs)))
    try:
        while waiting or running:
            for i, (slot, child) in list(running.items()):
                out = child.poll()
                if out is not None:
                    outcomes[i] = out
                    del running[i]
            busy = {slot for slot, _ in running.values()}
            while waiting and len(busy) < len(slots):
                load: dict[str | None, int] = {}
                for slot in busy:
                    load[slot.device] = load.get(slot.device, 0) + 1
                free = [s for s in slots if s not in busy]
                slot = min(free, key=lambda s: (load.get(s.device, 0), slots.index(s)))  # the least loaded device
                i = waiting.pop(0)
                try:
                    child = start(jobs[i], slot)
                except Exception as e:  # noqa: BLE001 - one job that cannot start is that job's failure only
                    outcomes[i] = Died(f"could not start: {type(e).__name__}: {e}"[:300])
                    continue
                running[i] = (slot, child)
                busy.add(slot)
                on_start(jobs[i], slot, child)
            if running:
                pause()
    except BaseException:
        stop_all([child for _, child in running.values()], stop_wait_s, pause)
        raise
    return [outcomes[i] for i in range(len(jobs))]


def stop_all(children: Sequence[Child], wait_s: float, pause: Callable[[], None] = lambda: time.sleep(POLL_S)) -> None:
    """SIGTERM every child, give them `wait_s` to end (their runs KILLED with their record complete), then SIGKILL."""
    for child in children:
        try:
            child.terminate()
        except Exception:  # noqa: BLE001 - already gone
            pass
    deadline = time.monotonic() + wait_s
    left = list(children)
    while left and time.monotonic() < deadline:
        left = [c for c in left if _alive(c)]
        if left:
            try:
                pause()
            except KeyboardInterrupt:  # a second Ctrl-C: stop waiting, kill now
                break
    for child in left:
        if _alive(child):
            try:
                child.kill()
            except Exception:  # noqa: BLE001
                pass


def _alive(child: Child) -> bool:
    try:
        return child.poll() is None
    except Exception:  # noqa: BLE001 - a child whose outcome cannot be read has ended
        return False


# ── the processes ───────────────────────────────────────────────────────────────────────────────────────────────────


def payload_json(payload: Payload) -> str:
    return json.dumps(asdict(payload))


def payload_from_json(text: str) -> Payload:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("a payload is a JSON object")
    data["resources"] = Resources(**data.get("resources") or {})
    return Payload(**data)


def child_env(base: dict[str, str], slot: Slot, slots: int, cpus: int | None) -> dict[str, str]:
    """A job's environment: pinned to its slot's CUDA device, and on a GPU with its share of the host's cores for its
    CPU threads (OMP_NUM_THREADS, unless set), so that N processes do not each start a thread per core. On CPU the
    threads are left as a run alone has them: a CPU run's numbers could depend on them."""
    env = dict(base)
    if slot.device is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot.device
        if "OMP_NUM_THREADS" not in env and cpus:
            env["OMP_NUM_THREADS"] = str(max(1, cpus // max(1, slots)))
    return env


class ProcessChild:
    """One job in a subprocess of this machine, pinned to its slot's device; its output in `log`."""

    def __init__(self, payload: Payload, slot: Slot, folder: Path, slots: int = 1):
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{payload.run_id}-{payload.attempt}"
        self.payload_path, self.result_path = folder / f"{stem}.payload.json", folder / f"{stem}.result.json"
        self.log = folder / f"{stem}.log"
        self.payload_path.write_text(payload_json(payload), encoding="utf-8")
        self.result_path.unlink(missing_ok=True)
        env = child_env(dict(os.environ), slot, slots, os.cpu_count())
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "archspec.launch.packed", str(self.payload_path), str(self.result_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)  # a terminal's Ctrl-C reaches the parent alone: it sends each child one SIGTERM
        self.pid = self.process.pid
        self._outcome: WorkerResult | Died | None = None

    def poll(self) -> WorkerResult | Died | None:
        if self._outcome is None and self.process.poll() is not None:
            self._outcome = self._read(self.process.returncode)
        return self._outcome

    def _read(self, code: int) -> WorkerResult | Died:
        try:
            data = json.loads(self.result_path.read_text(encoding="utf-8")[:1 << 20])
            for done in (self.payload_path, self.result_path):  # read: only the log stays
                done.unlink(missing_ok=True)
            return WorkerResult(**{k: data.get(k) for k in ("run_id", "status", "error", "val_loss", "scheduler_job")},
                                host=str(data.get("host") or ""))
        except (OSError, ValueError, TypeError):
            return Died(f"exit code {code} with no result (its log: {self.log})")

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()


def devices_for(device: str, device_type: str) -> list[str | None]:
    """The devices the slots pin to: every visible CUDA device (by its index in CUDA_VISIBLE_DEVICES' own terms), or
    [None] on CPU."""
    if device_type != "cuda":
        return [None]
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [d.strip() for d in visible.split(",") if d.strip()] if visible else []
    count = torch.cuda.device_count()
    return (names[:count] if len(names) >= count else [str(i) for i in range(count)]) or [None]


class PackedLauncher(Launcher):
    """The launcher contract (archspec.launch.base) over `run_packed`: `submit` only queues, `wait` runs them all."""

    name = "packed"

    def __init__(self, settings: LauncherSettings, per_device: int, devices: Sequence[str | None],
                 on_event: Callable[[str], None] = lambda line: None):
        super().__init__(settings)
        self.slots = slots_for(devices, per_device)
        self.folder = Path(settings.folder) / "packed"
        self.on_event = on_event
        self._counter = 0

    def submit(self, payloads: Sequence[Payload]) -> list[Handle]:
        handles = []
        for p in payloads:
            self._counter += 1
            handles.append(Handle(p, f"packed-{os.getpid()}-{self._counter}"))
        return handles

    def wait(self, handles: Sequence[Handle]) -> list[WorkerResult | Died]:
        def start(h: Handle, slot: Slot) -> ProcessChild:
            return ProcessChild(h.payload, slot, self.folder, len(self.slots))

        def started(h: Handle, slot: Slot, child: ProcessChild) -> None:
            where = f"cuda:{slot.device}" if slot.device is not None else "cpu"
            h.native, h.job_id = child, f"pid {child.pid} on {where} slot {slot.index}"
            self.on_started(h)  # "... submitted as packed job pid N on cpu slot 0"

        self.on_event(f"packed jobs' logs: {self.folder}/RUN_ID-ATTEMPT.log")
        return run_packed(list(handles), self.slots, start, on_start=started)


class PackedRequest:
    """What `archspec ablate --jobs-per-device` hands the sweep runner (archspec.ablate.runner.run_jobs(launcher=...)):
    `prepare` resolves N from the checked builds' memory plans and returns None when one job at a time is all
    (the runner then trains in its own process, as without the option), else itself."""

    def __init__(self, settings: LauncherSettings, requested: int | str, log_to: Sequence[str] | None = None):
        self.settings, self.requested, self.log_to = settings, requested, log_to
        self.per_device = 1
        self.devices: list[str | None] = [None]

    def device_type(self, device: str) -> str:
        from archspec.train.distributed import resolve_device

        return resolve_device(device).type

    def prepare(self, builds: dict, device: str, on_event: Callable[[str], None]) -> "PackedRequest | None":
        device_type = self.device_type(device)
        plans = [b.memory.total for b in builds.values() if getattr(b, "memory", None) is not None]
        free = cuda_free_bytes() if device_type == "cuda" and self.requested == "auto" else []
        self.per_device, why = jobs_per_device(self.requested, device_type, plans, free)
        self.devices = devices_for(device, device_type)
        on_event(f"{why}; {len(self.devices)} device(s): up to {self.per_device * len(self.devices)} job(s) at once")
        return self if self.per_device * len(self.devices) > 1 else None

    def run(self, sweep, launched, builds, registry, *, device: str, compile: bool | None, cache,
            on_event: Callable[[str], None]) -> list:
        from archspec.launch.sweeps import launch_jobs

        child_device = "cuda" if self.devices != [None] else device  # one visible device per child

        def make(settings: LauncherSettings) -> PackedLauncher:
            return PackedLauncher(settings, self.per_device, self.devices, on_event)

        return launch_jobs(self.settings, sweep, launched, builds, registry, device=child_device, compile=compile,
                           cache=cache, log_to=self.log_to, on_event=on_event, make=make)


# ── the child ───────────────────────────────────────────────────────────────────────────────────────────────────────


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m archspec.launch.packed PAYLOAD RESULT`: one job, its WorkerResult written to RESULT as JSON."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        sys.stderr.write("usage: python -m archspec.launch.packed PAYLOAD.json RESULT.json\n")
        return 2
    from archspec.signals import enforce_stop_deadline

    enforce_stop_deadline()  # an archspec process of its own: a stop that hangs is forced (archspec.signals)
    from archspec.launch.worker import run_payload

    payload = payload_from_json(Path(args[0]).read_text(encoding="utf-8")[:64 << 20])
    code = 0
    try:
        result = run_payload(payload)
    except KeyboardInterrupt as e:  # the run ended KILLED (the loop recorded it): say so, exit as the shell would
        result = WorkerResult(payload.run_id, "KILLED", str(e) or "interrupted")
        code = getattr(e, "exit_code", 130)
    tmp = Path(args[1] + ".tmp")
    tmp.write_text(json.dumps(asdict(result)), encoding="utf-8")
    tmp.replace(args[1])
    return code


if __name__ == "__main__":
    sys.exit(main())
