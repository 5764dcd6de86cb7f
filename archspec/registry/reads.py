"""Registry reads: runs and specs by filter, one run, metric histories, artifacts. Reads never write.

Nothing here reaps, migrates or creates: a database that holds no registry yet reads as empty, a RUNNING run whose
writer stopped beating is shown as it is with `stale` set (`archspec runs reap` marks such runs KILLED), and a schema
this code cannot read is refused with the command that upgrades it (see `RegistryEngine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Generic

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from archspec.errors import UserError, printable
from archspec.registry.artifact_paths import resolved
from archspec.registry.engine import RegistryEngine, T, chunks, utcnow
from archspec.registry.models import (Artifact, Evaluation, EvaluationMetric, Metric, MetricStats, RunNote,
                                      RunRecord, RunTag, SpecName, SpecRecord, SummaryMetric, SweepRun)
from archspec.registry.query.fields import check_known_keys, higher_is_better, resolve_field
from archspec.registry.query.sql import compile_filter, compile_sort
from archspec.registry.values import (WRITER_IDENTITY, accounting_fields, flatten, is_stale, load_json, number, run_params,
                                     writer_gone)
from archspec.train.logger import RUNNING, SweepMembership
from archspec.recipe import RecipeView

# ── query results ────────────────────────────────────────────────────────────────────────────────────────────────


class QueryResult(list, Generic[T]):
    """A list of rows, with `.to_pandas()` when pandas is installed (`pip install 'archspec[pandas]'`)."""

    def to_pandas(self):
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install 'archspec[pandas]'") from None
        return pd.DataFrame([row.flat() for row in self])


class _SpecCache:
    """Parsed model JSON and accounting per spec hash, shared by all rows of one query (many runs share a model)."""

    def __init__(self) -> None:
        self.raw: dict[str, tuple[str, str]] = {}  # hash → (canonical_json, accounting_json)
        self.parsed: dict[str, tuple[dict, dict, dict]] = {}  # hash → (model, accounting, accounting fields)

    def get(self, model_hash: str) -> tuple[dict, dict, dict]:
        if model_hash not in self.parsed:
            canonical, accounting = self.raw.get(model_hash, ("{}", "{}"))
            acct = load_json(accounting, f"specs {model_hash[:12]} accounting_json", {})
            spec = load_json(canonical, f"specs {model_hash[:12]} canonical_json", {})
            if not isinstance(acct, dict):
                acct = {}
            self.parsed[model_hash] = (spec if isinstance(spec, dict) else {}, acct, accounting_fields(acct))
        return self.parsed[model_hash]


@dataclass
class SpecRow:
    """A recorded model with the names it was built under and its accounting at context_length."""

    hash: str
    name: str  # the first name it was recorded under
    generated_hash: str | None
    created: datetime
    n_runs: int
    _cache: _SpecCache = field(repr=False)
    names: list[str] = field(default_factory=list)  # every name, oldest first

    @property
    def spec(self) -> dict[str, Any]:
        """`{"model": ...}`: a spec's identity is its model (recipes belong to runs)."""
        return {"model": self._cache.get(self.hash)[0]}

    @property
    def accounting(self) -> dict[str, Any]:
        return self._cache.get(self.hash)[1]

    @property
    def params(self) -> dict[str, Any]:
        return flatten(self.spec)

    def get(self, name: str) -> Any:
        """The value of a filter/sort field (`params.active`, `params.model.d_model`, `name`)."""
        ref = resolve_field(name, "specs")
        if ref.kind == "names":
            return ", ".join(self.names)
        if ref.kind == "attr":
            return getattr(self, "hash" if ref.key in ("model_hash", "spec_hash") else ref.key)
        if ref.kind == "acct":
            return self._cache.get(self.hash)[2].get(ref.key)
        return self.params.get(ref.key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hash": self.hash, "name": self.name, "names": self.names, "generated_hash": self.generated_hash,
            "created": self.created.isoformat() if self.created else None, "runs": self.n_runs,
            "accounting": self.accounting, "spec": self.spec,
        }

    def flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hash": self.hash, "name": self.name, "names": ", ".join(self.names),
                               "generated_hash": self.generated_hash, "created": self.created, "runs": self.n_runs}
        out.update(self._cache.get(self.hash)[2])
        out.update({f"params.{k}": v for k, v in self.params.items()})
        return out


@dataclass
class RunRow:
    """A run as the registry sees it: attributes, its own accounting (at its seq_len), its sweeps, latest/best
    metrics, summary, tags."""

    id: str
    name: str
    status: str
    model_hash: str
    data_hash: str
    seed: int
    host: str
    code_version: str
    error: str | None
    created: datetime
    started: datetime | None
    ended: datetime | None
    heartbeat: datetime | None
    attempt: int
    recipe_json: str = field(repr=False)
    accounting_json: str = field(default="{}", repr=False)
    memberships: dict[str, SweepMembership] = field(default_factory=dict)  # sweep name → the run's place in it
    heartbeat_timeout_s: float = 0.0  # the writer's own: a RUNNING run with an older heartbeat is stale
    read_at: datetime | None = field(default=None, repr=False)  # the reader's clock when the row was read
    metrics: dict[str, float] = field(default_factory=dict)  # latest value per key
    best: dict[str, float] = field(default_factory=dict)  # best value per key: lowest, or highest (higher_is_better)
    min: dict[str, float] = field(default_factory=dict)
    max: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # last step per key
    summary: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    # Capability probes (`archspec probe`): the latest evaluation's value per key (`accuracy`) and per task and key
    # (`passkey.accuracy`), as `probe.<key>` filters read them.
    probes: dict[str, float] = field(default_factory=dict)
    _cache: _SpecCache = field(default_factory=_SpecCache, repr=False)
    # `name` is what the run is shown as: the name a user gave it (`archspec runs rename`), else its spec's name.
    spec_name: str = ""  # the spec's name, as the run was trained under it
    note: str | None = None  # the latest note (`archspec runs note`); `notes` on the Registry has them all
    scheduler_job: str | None = None  # the launcher's job id (SLURM job/array task, Ray task); None: in-process

    @property
    def spec(self) -> dict[str, Any]:
        """The spec as run: its name, its model, and the recipe actually used."""
        return {"name": self.spec_name or self.name, "model": self._cache.get(self.model_hash)[0], "train": self.recipe}

    @cached_property
    def accounting(self) -> dict[str, Any]:
        """The run's own accounting, at its seq_len (`seq_len` says which)."""
        return load_json(self.accounting_json or "{}", f"runs {self.id} accounting_json", {})

    @cached_property
    def accounting_fields(self) -> dict[str, int | float]:
        return accounting_fields(self.accounting)

    @property
    def sweeps(self) -> list[str]:
        """Every sweep the run belongs to (membership: one experiment may serve several sweeps)."""
        return sorted(self.memberships)

    @property
    def sweep(self) -> str | None:
        """The sweeps, comma-separated, for display; None when it belongs to none."""
        return ", ".join(self.sweeps) or None

    @cached_property
    def recipe(self) -> dict[str, Any]:
        """The train recipe actually used (parsed on first use: listing 10,000 runs rarely needs it)."""
        recipe = load_json(self.recipe_json, f"runs {self.id} recipe_json", {})
        return recipe if isinstance(recipe, dict) else {}

    @property
    def params(self) -> dict[str, Any]:
        return run_params(self.spec, self.recipe)

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens one optimizer step trained on (batch × grad_accum × seq_len × data-parallel replicas); None when
        the stored recipe does not say (a damaged row)."""
        view = RecipeView.stored(self.recipe)  # archspec.recipe: the one rule
        n = view.tokens_per_step if view is not None else 0
        return n if n > 0 else None

    @property
    def stale(self) -> bool:
        """RUNNING, but its writer stopped beating (the process died or was killed); `archspec runs reap` (or the next
        run start or sweep) marks it KILLED. Computed when asked, never written by a read."""
        return self.status == RUNNING and (is_stale(self.heartbeat, self.heartbeat_timeout_s, self.read_at or utcnow())
                                           or writer_gone(self.host, self.tags))

    @property
    def duration_s(self) -> float | None:
        end = self.ended or self.heartbeat
        return (end - self.started).total_seconds() if self.started and end else None

    def get(self, name: str) -> Any:
        """The value of a filter/sort field (`metrics.val_loss`, `params.active`, `status`, ...)."""
        ref = resolve_field(name, "runs")
        if ref.kind in ("attr", "sweep"):
            return getattr(self, ref.key)
        if ref.kind == "acct":
            return self.accounting_fields.get(ref.key)
        if ref.kind == "param":
            return self.params.get(ref.key)
        if ref.kind == "metric":
            return {"last": self.metrics, "min": self.min, "max": self.max}[ref.aggregate].get(ref.key)
        if ref.kind == "summary":
            return self.summary.get(ref.key)
        if ref.kind == "probe":
            return self.probes.get(f"{ref.aggregate}.{ref.key}" if ref.aggregate else ref.key)
        return self.tags.get(ref.key)

    def to_dict(self) -> dict[str, Any]:
        def iso(t: datetime | None) -> str | None:
            return t.isoformat() if t else None

        return {
            "id": self.id, "name": self.name, "spec_name": self.spec_name, "note": self.note, "status": self.status,
            "sweeps": self.sweeps, "seed": self.seed,
            "model_hash": self.model_hash, "data_hash": self.data_hash, "host": self.host,
            "code_version": self.code_version, "attempt": self.attempt, "created": iso(self.created),
            "started": iso(self.started), "ended": iso(self.ended), "heartbeat": iso(self.heartbeat),
            "error": self.error, "stale": self.stale, "accounting": self.accounting, "recipe": self.recipe,
            "metrics": self.metrics,
            "best": self.best, "max": self.max, "steps": self.steps, "summary": self.summary, "tags": self.tags,
            "probes": self.probes,
        }

    def flat(self, params: bool = True) -> dict[str, Any]:
        """One flat record (CSV, pandas): attributes, accounting, metrics, summary, tags and (optionally) params."""
        out: dict[str, Any] = {
            k: getattr(self, k) for k in ("id", "name", "spec_name", "note", "status", "sweep", "seed", "model_hash",
                                          "data_hash", "host", "code_version", "attempt", "created", "started",
                                          "ended", "error")
        }
        out.update(self.accounting_fields)
        out.update({f"metrics.{k}": v for k, v in self.metrics.items()})
        out.update({f"metrics.best.{k}": v for k, v in self.best.items()})
        out.update({f"metrics.min.{k}": v for k, v in self.min.items()})
        out.update({f"metrics.max.{k}": v for k, v in self.max.items()})
        out.update({f"summary.{k}": v for k, v in self.summary.items()})
        out.update({f"tags.{k}": v for k, v in self.tags.items()})
        out.update({f"probe.{k}": v for k, v in self.probes.items()})
        if params:
            out.update({f"params.{k}": v for k, v in self.params.items()})
        return out


@dataclass(frozen=True)
class MetricPoint:
    step: int
    value: float
    time: float


    # reading


class RegistryReader(RegistryEngine):
    """The reading half of `Registry`."""

    def run_status(self, run_id: str) -> str | None:
        """The run's recorded status; None when it is not recorded. A RUNNING run may be stale (its process gone):
        `run_state` says which."""
        return self.run_state(run_id)[0]

    def run_state(self, run_id: str) -> tuple[str | None, bool]:
        """(status, stale): the recorded status, and whether a RUNNING run's heartbeat is older than its timeout."""

        def tx(conn: Connection) -> tuple[str | None, bool]:
            row = conn.execute(select(RunRecord.status, RunRecord.heartbeat, RunRecord.heartbeat_timeout_s,
                                      RunRecord.host).where(RunRecord.id == run_id)).first()
            if row is None:
                return None, False
            if row.status != RUNNING:
                return row.status, False
            tags = dict(conn.execute(select(RunTag.key, RunTag.value).where(
                RunTag.run_id == run_id, RunTag.key.in_(WRITER_IDENTITY))).all())
            stale = is_stale(row.heartbeat, row.heartbeat_timeout_s, self._now()) or writer_gone(row.host, tags)
            return row.status, stale

        return self._read(tx, "run_status", empty=lambda: (None, False))

    def runs(self, where: str | None = None, sort: str | None = None, limit: int | None = None) -> QueryResult[RunRow]:
        """Runs matching a filter (see archspec.registry.query), sorted (default: newest first); `limit` None or 0:
        all. A RUNNING run whose writer stopped beating is returned as it is, with `stale` set."""
        cond = compile_filter(where, "runs")
        order = compile_sort(sort, "runs")
        if limit is not None and limit < 0:
            raise UserError(f"--limit must be >= 0, got {limit}")
        if where or sort:  # a misspelt metric would otherwise match nothing (or sort by nothing), silently
            check_known_keys(where, sort, *self.known_keys())
        q = select(RunRecord).where(cond).order_by(*order, RunRecord.created.desc(), RunRecord.id)
        if limit:
            q = q.limit(limit)
        return self._read(lambda conn: self._load_runs(conn, q), "runs", empty=QueryResult)

    def known_keys(self) -> tuple[set[str], set[str], set[str]]:
        """(metric keys, summary keys, probe keys) that some run in the registry has; probe keys both bare
        (`accuracy`) and under their task (`passkey.accuracy`)."""
        def tx(conn: Connection) -> tuple[set[str], set[str], set[str]]:
            metrics = set(conn.execute(select(MetricStats.key).distinct()).scalars())
            summary = set(conn.execute(select(SummaryMetric.key).distinct()).scalars())
            probes: set[str] = set()
            for task, key in conn.execute(select(Evaluation.task, EvaluationMetric.key).distinct()
                                          .join(Evaluation, Evaluation.id == EvaluationMetric.evaluation_id)).all():
                probes.update((key, f"{task}.{key}"))
            return metrics, summary, probes

        return self._read(tx, "known keys", empty=lambda: (set(), set(), set()))

    def _load_runs(self, conn: Connection, q) -> QueryResult[RunRow]:
        cache = _SpecCache()
        now = self._now()
        rows: list[RunRow] = [
            RunRow(
                id=r.id, name=r.display_name or r.name, spec_name=r.name, status=r.status,
                model_hash=r.spec_hash,  # the column keeps its stored name
                data_hash=r.data_hash, seed=r.seed,
                host=r.host, code_version=r.code_version, error=r.error, created=r.created,
                started=r.started, ended=r.ended, heartbeat=r.heartbeat, attempt=r.attempt,
                recipe_json=r.recipe_json, accounting_json=r.accounting_json, heartbeat_timeout_s=r.heartbeat_timeout_s, read_at=now,
                _cache=cache, scheduler_job=r.scheduler_job,
            )
            for r in conn.execute(q).all()  # fetchall: row-by-row fetching costs a third of a 10,000-run listing
        ]
        by_id = {row.id: row for row in rows}
        for chunk in chunks(list({row.model_hash for row in rows})):
            for h, canonical in conn.execute(
                select(SpecRecord.hash, SpecRecord.canonical_json).where(SpecRecord.hash.in_(chunk))
            ).all():
                cache.raw[h] = (canonical, "{}")
        stats = select(MetricStats.run_id, MetricStats.key, MetricStats.last_step, MetricStats.last_value,
                       MetricStats.min_value, MetricStats.max_value)
        for chunk in chunks(list(by_id)):
            for run_id, key, last_step, last, lo, hi in conn.execute(stats.where(MetricStats.run_id.in_(chunk))).all():
                row = by_id[run_id]
                row.metrics[key] = number(last, f"metric_stats {run_id} {key}")
                row.steps[key] = last_step
                if lo is not None:
                    row.min[key] = number(lo, f"metric_stats {run_id} {key}")
                if hi is not None:
                    row.max[key] = number(hi, f"metric_stats {run_id} {key}")
                best = row.max.get(key) if higher_is_better(key) else row.min.get(key)
                if best is not None:
                    row.best[key] = best
            for run_id, key, value in conn.execute(
                select(SummaryMetric.run_id, SummaryMetric.key, SummaryMetric.value)
                .where(SummaryMetric.run_id.in_(chunk))
            ).all():
                by_id[run_id].summary[key] = number(value, f"summary_metrics {run_id} {key}")
            for run_id, key, value in conn.execute(
                select(RunTag.run_id, RunTag.key, RunTag.value).where(RunTag.run_id.in_(chunk))
            ).all():
                by_id[run_id].tags[key] = value
            for m in conn.execute(select(SweepRun).where(SweepRun.run_id.in_(chunk))).all():
                by_id[m.run_id].memberships[m.sweep] = SweepMembership(m.sweep, m.variant, m.label, m.sweep_hash,
                                                                      m.baseline)
            for run_id, task, key, value in conn.execute(  # oldest first: the latest evaluation's value stays
                select(Evaluation.run_id, Evaluation.task, EvaluationMetric.key, EvaluationMetric.value)
                .join(Evaluation, Evaluation.id == EvaluationMetric.evaluation_id)
                .where(Evaluation.run_id.in_(chunk)).order_by(Evaluation.id)
            ).all():
                v = number(value, f"evaluation_metrics {run_id} {key}")
                by_id[run_id].probes[key] = by_id[run_id].probes[f"{task}.{key}"] = v
            for run_id, text in conn.execute(  # oldest first: the latest note stays
                select(RunNote.run_id, RunNote.text).where(RunNote.run_id.in_(chunk)).order_by(RunNote.id)
            ).all():
                by_id[run_id].note = text
        return QueryResult(rows)

    def get_run(self, run_id: str) -> RunRow:
        """One run by id or by a unique id prefix (at least 4 characters); UserError when unknown or ambiguous."""
        run_id = run_id.strip()
        if len(run_id) > 64:  # ids are 16 hex characters; a longer "prefix" matches nothing (and LIKE has limits)
            raise UserError(f"no run {printable(run_id, 40)!r} in registry {self.url}: run ids are 16 characters")

        def tx(conn: Connection) -> RunRow:
            row = conn.execute(select(RunRecord).where(RunRecord.id == run_id)).first()
            if row is None and len(run_id) >= 4:
                pattern = run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
                matches = conn.execute(
                    select(RunRecord.id).where(RunRecord.id.like(pattern, escape="\\")).limit(6)
                ).scalars().all()
                if len(matches) > 1:
                    shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
                    raise UserError(f"run id prefix {run_id!r} is ambiguous: {shown}")
                if matches:
                    run_id_full = matches[0]
                    return self._load_runs(conn, select(RunRecord).where(RunRecord.id == run_id_full))[0]
            if row is None:
                unknown()
            return self._load_runs(conn, select(RunRecord).where(RunRecord.id == run_id))[0]

        def unknown() -> RunRow:
            short = " (an id prefix needs at least 4 characters)" if len(run_id) < 4 else ""
            raise UserError(f"no run {run_id!r} in registry {self.url}{short} (`archspec runs list` shows the runs)")

        return self._read(tx, "get_run", empty=unknown)

    def notes(self, run_id: str) -> list[tuple[datetime, str]]:
        """Every note of a run, oldest first: (created, text)."""
        return self._read(lambda conn: [(r.created, r.text) for r in conn.execute(
            select(RunNote.created, RunNote.text).where(RunNote.run_id == run_id).order_by(RunNote.id))],
            "notes", empty=list)

    def metric_history(self, run_id: str, key: str) -> list[MetricPoint]:
        """Every point of one metric of a run, in step order (NaN where the value was NaN)."""
        return self._read(lambda conn: [
            MetricPoint(r.step, number(r.value, f"metrics {run_id} {key} step {r.step}"), r.time)
            for r in conn.execute(
                select(Metric.step, Metric.value, Metric.time)
                .where(Metric.run_id == run_id, Metric.key == key)
                .order_by(Metric.step, Metric.id)
            )
        ], "metric_history", empty=list)

    def metric_histories(self, run_id: str) -> dict[str, list[MetricPoint]]:
        """Every metric of a run: key → points in step order."""

        def tx(conn: Connection) -> dict[str, list[MetricPoint]]:
            out: dict[str, list[MetricPoint]] = {}
            for r in conn.execute(
                select(Metric.key, Metric.step, Metric.value, Metric.time)
                .where(Metric.run_id == run_id).order_by(Metric.key, Metric.step, Metric.id)
            ):
                out.setdefault(r.key, []).append(
                    MetricPoint(r.step, number(r.value, f"metrics {run_id} {r.key} step {r.step}"), r.time))
            return out

        return self._read(tx, "metric_histories", empty=dict)

    def artifacts(self, run_id: str) -> list[tuple[str, str]]:
        """(kind, path) of every artifact of a run, oldest first."""
        return self._read(lambda conn: [
            (r.kind, resolved(r.path)) for r in conn.execute(
                select(Artifact.kind, Artifact.path).where(Artifact.run_id == run_id).order_by(Artifact.id))
        ], "artifacts", empty=list)

    def all_artifacts(self) -> list[tuple[str, str, str]]:
        """(run id, kind, path) of every recorded artifact, oldest first (housekeeping: whose files are where)."""
        return self._read(lambda conn: [(r.run_id, r.kind, resolved(r.path)) for r in conn.execute(
            select(Artifact.run_id, Artifact.kind, Artifact.path).order_by(Artifact.id))], "artifacts", empty=list)

    def run_checkpoint(self, run_ref: str, purpose: str = "use") -> tuple[RunRow, Path]:
        """The run (by id or unique prefix) and the checkpoint it recorded last, as a path that exists on this host.

        Paths are recorded absolute (`add_artifact`), with the writing host on the run; one that is not here (another
        machine, or moved) is a UserError naming the host that wrote it and the path. Paths recorded relative by an
        older archspec resolve against the working directory only, and say so when they do not."""
        import socket

        run = self.get_run(run_ref)
        checkpoints = [p for kind, p in self.artifacts(run.id) if kind == "checkpoint"]
        if not checkpoints:
            raise UserError(f"run {run.id} has no checkpoint recorded (status {run.status}); nothing to {purpose}")
        path = Path(checkpoints[-1])
        if path.is_file():
            return run, path
        here = socket.gethostname()
        where = printable(str(path), 300)
        if not path.is_absolute():
            raise UserError(f"run {run.id}: its checkpoint was recorded as the relative path {where} (by an older "
                            f"archspec, on host {printable(run.host or 'unknown', 80)}) and is not under this directory; "
                            "run this from the directory the run was started in, or pass the checkpoint file")
        host = printable(run.host or "an unknown host", 80)
        elsewhere = f"written on host {host}; this is {printable(here, 80)}" if run.host and run.host != here \
            else f"written on host {host}, this host"
        raise UserError(f"run {run.id}: its checkpoint {where} does not exist here ({elsewhere}); copy the run "
                        "directory to this host and pass it, or the checkpoint file, instead of the run id")

    def evaluations(self, run_id: str) -> list[dict[str, Any]]:
        """A run's capability probes, oldest first: id, task, params, checkpoint, code_version, created, metrics."""
        def tx(conn: Connection) -> list[dict[str, Any]]:
            rows = conn.execute(select(Evaluation).where(Evaluation.run_id == run_id).order_by(Evaluation.id)).all()
            out = []
            for e in rows:
                metrics = {k: number(v, f"evaluation_metrics {e.id} {k}") for k, v in conn.execute(
                    select(EvaluationMetric.key, EvaluationMetric.value)
                    .where(EvaluationMetric.evaluation_id == e.id).order_by(EvaluationMetric.key)).all()}
                out.append({"id": e.id, "task": e.task,
                            "params": load_json(e.params_json, f"evaluations {e.id} params_json", {}),
                            "checkpoint": resolved(e.checkpoint), "code_version": e.code_version,
                            "created": e.created.isoformat() if e.created else None, "metrics": metrics})
            return out

        return self._read(tx, "evaluations", empty=list)

    def count_metrics(self, run_id: str | None = None) -> int:
        """Number of stored metric points (of one run, or of all)."""
        q = select(func.count()).select_from(Metric)
        if run_id is not None:
            q = q.where(Metric.run_id == run_id)
        return self._read(lambda conn: int(conn.execute(q).scalar_one()), "count_metrics", empty=int)

    def sweep_names(self) -> list[tuple[str, int]]:
        """Every sweep the registry knows, with how many runs belong to it, by name."""
        q = select(SweepRun.sweep, func.count(SweepRun.run_id)).group_by(SweepRun.sweep).order_by(SweepRun.sweep)
        return self._read(lambda conn: [(str(a), int(b)) for a, b in conn.execute(q)], "sweep_names", empty=list)

    def specs(
        self, where: str | None = None, sort: str | None = None, limit: int | None = None
    ) -> QueryResult[SpecRow]:
        """Recorded specs matching a filter over params and accounting (default: newest first)."""
        cond = compile_filter(where, "specs")
        order = compile_sort(sort, "specs")
        if limit is not None and limit < 0:
            raise UserError(f"--limit must be >= 0, got {limit}")
        n_runs = select(func.count()).where(RunRecord.model_hash == SpecRecord.hash).scalar_subquery()
        q = (select(SpecRecord.hash, SpecRecord.name, SpecRecord.generated_hash, SpecRecord.created,
                    SpecRecord.canonical_json, SpecRecord.accounting_json, n_runs.label("n_runs"))
             .where(cond).order_by(*order, SpecRecord.created.desc(), SpecRecord.hash))
        if limit:
            q = q.limit(limit)

        def tx(conn: Connection) -> QueryResult[SpecRow]:
            cache = _SpecCache()
            out: QueryResult[SpecRow] = QueryResult()
            for r in conn.execute(q).all():
                cache.raw[r.hash] = (r.canonical_json, r.accounting_json)
                out.append(SpecRow(r.hash, r.name, r.generated_hash, r.created, int(r.n_runs), cache))
            by_hash = {row.hash: row for row in out}
            for chunk in chunks(list(by_hash)):
                for h, name in conn.execute(select(SpecName.model_hash, SpecName.name).where(SpecName.model_hash.in_(chunk))
                                            .order_by(SpecName.created, SpecName.name)).all():
                    by_hash[h].names.append(name)
            return out

        return self._read(tx, "specs", empty=QueryResult)

