"""The logger interface between the training loop and wherever runs are recorded.

The loop only talks to a `RunLogger`; the registry (`archspec.registry.RegistryLogger`) implements it, and so do
`NullLogger` (tests) and anything a user plugs in. Nothing in the loop knows about SQL.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

# Run states, shared by the loop and the registry.
SCHEDULED, RUNNING, FINISHED, FAILED, KILLED = "SCHEDULED", "RUNNING", "FINISHED", "FAILED", "KILLED"
STATUSES = (SCHEDULED, RUNNING, FINISHED, FAILED, KILLED)


class RecordingError(RuntimeError):
    """The place a run is recorded cannot be written (a full disk, a read-only database, a lost server): raised by a
    RunLogger so that the loop stops with a checkpoint and says so, instead of training on unrecorded or dying at the
    final write with a traceback. Not bad input, so not a UserError: the CLI exits 1 with this message."""


# Recipe fields that change only how, or how often, something is computed or observed: stored with the run, not part
# of its identity. Everything else in the recipe (optimizer, schedule, steps, batch, seq_len, grad_accum, precision,
# data, world size, and any field added later) changes what is learned, so a new field is identity unless listed.
NOT_IDENTITY = frozenset({
    "seed",  # identity, but a part of the key of its own
    "compile", "activation_checkpointing", "checkpointing", "parallel", "strategy", "fsdp",
    "eval_interval", "eval_batches", "eval_tokens", "checkpoint_interval", "device",
    "log_to",  # where else the run is sent (archspec.train.sinks): observation only
    "stability",  # per-layer stability metrics at evaluations (archspec.train.metrics): observation only
})


def learning_recipe(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe fields that change what is learned. The global micro-batch — batch_size per data-parallel replica
    × the data-parallel size (`data_parallel`: processes / (tp · pp), 1 when absent; before tensor and pipeline
    parallelism it was stored as `world_size`) — is one of them, and how it is spread over processes is not: two
    replicas of 4 sequences see the global batch one process of 8 does (archspec.train.sampling), and tp or pp
    processes split one replica's work. It is hashed as `batch_size` with `world_size` 1, which is what every
    single-process run hashed, so those keep their ids (a multi-process data-parallel run recorded before this hashed
    its per-replica batch and its world size: the same experiment run now gets the id one process of the global
    batch has)."""
    out = {k: v for k, v in recipe.items() if k not in NOT_IDENTITY}
    dp = out.pop("data_parallel", None)
    dp = int(dp if dp is not None else out.get("world_size", 1) or 1)
    if isinstance(out.get("batch_size"), int):
        out["batch_size"] = out["batch_size"] * dp
    out["world_size"] = 1
    return out


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                                     default=str).encode()).hexdigest()


def recipe_hash(recipe: Mapping[str, Any]) -> str:
    """sha256 of the learning recipe (`learning_recipe`)."""
    return _digest(learning_recipe(recipe))


def run_key(model_hash: str, recipe: Mapping[str, Any], data_hash: str, seed: int) -> str:
    """The run id, from content alone: (model hash, recipe hash, data hash, seed). The same experiment is the same run
    whatever the spec or sweep is called and however it is computed or observed. The one function for it: the loop,
    the sweep runner and the registry call it."""
    return _digest({"model": model_hash, "recipe": recipe_hash(recipe), "data": data_hash, "seed": int(seed)})[:16]


@dataclass(frozen=True)
class SweepMembership:
    """A run's place in one sweep (a run can belong to several): what the sweep's report groups it by."""

    sweep: str
    variant: int
    label: str
    sweep_hash: str = ""
    baseline: int = 0


def repeat_id(run_id: str, n: int) -> str:
    """The id of the n-th repeat (n >= 1) of a finished run: `archspec train` of an experiment that already FINISHED
    records a new run under this id, so the finished one is never replaced."""
    return hashlib.sha256(f"{run_id}:repeat:{n}".encode()).hexdigest()[:16]


@dataclass
class RunInfo:
    """Everything known about a run before its first step."""

    spec_name: str
    model_hash: str  # the model hash (archspec.spec.model_hash)
    spec_json: dict[str, Any]  # canonical, fully-defaulted spec (its `model` section is what spec_hash covers)
    generated_hash: str  # sha256 of the generated module source
    accounting: dict[str, Any]  # account(spec, seq_len=the run's seq_len).to_dict(), plus "seq_len"
    data_hash: str
    seed: int
    recipe: dict[str, Any]  # the train recipe actually used (after CLI overrides)
    code_version: str = ""
    sweep: SweepMembership | None = None
    host: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    repeat: int = 0  # n >= 1: the n-th repeat of a FINISHED run of the same experiment (`archspec train` again)
    spec_accounting: dict[str, Any] | None = None  # the model's, at context_length (the spec's row); None: leave it
    key: str = ""  # the run key as the run's build computed it (archspec.train.build); "" for a bare RunInfo

    @property
    def experiment_id(self) -> str:
        """The build's run key; a RunInfo made without a build (tests, benches) derives it by the same function."""
        return self.key or run_key(self.model_hash, self.recipe, self.data_hash, self.seed)

    @property
    def run_id(self) -> str:
        return repeat_id(self.experiment_id, self.repeat) if self.repeat else self.experiment_id


@runtime_checkable
class RunLogger(Protocol):
    """What the loop calls, in order: start → (log_metrics | heartbeat | log_artifact)* → set_summary → end."""

    def start(self, info: RunInfo) -> str:
        """Record the run as RUNNING; return its id."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Queue metric points for `step` (buffered; flushed in batches)."""

    def heartbeat(self) -> None:
        """Say the run is alive (also a good moment to flush buffered metrics)."""

    def log_artifact(self, kind: str, path: str) -> None:
        """Record a file the run produced (checkpoint, plot)."""

    def set_summary(self, metrics: Mapping[str, float]) -> None:
        """Final/summary metrics (final val loss, tokens/s, ...)."""

    def end(self, status: str, error: str | None = None) -> None:
        """Flush everything and set the final status (FINISHED / FAILED / KILLED)."""


class NullLogger:
    """Keeps everything in memory; used by tests and by `--no-log` runs."""

    def __init__(self) -> None:
        self.info: RunInfo | None = None
        self.metrics: list[tuple[int, str, float]] = []
        self.artifacts: list[tuple[str, str]] = []
        self.summary: dict[str, float] = {}
        self.status: str | None = None
        self.error: str | None = None
        self.heartbeats = 0

    def start(self, info: RunInfo) -> str:
        self.info = info
        self.status = RUNNING
        return info.run_id

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics.extend((step, k, float(v)) for k, v in metrics.items())

    def heartbeat(self) -> None:
        self.heartbeats += 1

    def log_artifact(self, kind: str, path: str) -> None:
        self.artifacts.append((kind, path))

    def set_summary(self, metrics: Mapping[str, float]) -> None:
        self.summary.update({k: float(v) for k, v in metrics.items()})

    def end(self, status: str, error: str | None = None) -> None:
        self.status, self.error = status, error
