"""The registry store: opening a database, recording specs and runs, and querying them.

    reg = Registry()                                   # $ARCHSPEC_REGISTRY or sqlite:///registry/archspec.db
    reg.runs(where="params.model.norm.kind = 'rmsnorm' and params.active < 20e6", sort="metrics.val_loss")

Every write is one short transaction, bounded by the database's lock wait (SQLite busy_timeout) and retried with
exponential backoff and jitter when the database says it is busy; SQLite runs in WAL mode so that readers never block
the writers. Write transactions on SQLite start with BEGIN IMMEDIATE: a deferred transaction that reads and then
writes can fail at once with SQLITE_BUSY without waiting, which is how "database is locked" escapes elsewhere.

Runs whose writer stopped sending heartbeats are marked KILLED by the next reader (`mark_stale_killed`), using the
heartbeat timeout the writer itself recorded.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sqlite3
import time
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Iterator, Mapping, Sequence, TypeVar

from sqlalchemy import Engine, create_engine, delete, event, func, insert, select, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError

from archspec.errors import UserError
from archspec.registry import migrate
from archspec.registry.models import (
    Artifact,
    Metric,
    MetricStats,
    RunParam,
    RunRecord,
    RunTag,
    SpecAccounting,
    SpecParam,
    SpecRecord,
    SummaryMetric,
)
from archspec.registry.query import compile_filter, compile_sort, resolve_field
from archspec.train.logger import FAILED, FINISHED, KILLED, RUNNING, SCHEDULED, RunInfo

log = logging.getLogger("archspec.registry")

DEFAULT_URL = "sqlite:///registry/archspec.db"
_CHUNK = 500  # ids per IN (...) list: far below SQLite's bound-variable limit on any version


# Every open registry, so that a forked child (a DataLoader worker, a sweep runner's fork) drops the pooled connections
# it inherited instead of sharing them with its parent (SQLAlchemy's advice for fork).
_OPEN: "weakref.WeakSet[Registry]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for reg in list(_OPEN):
        reg.engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def default_url() -> str:
    """`$ARCHSPEC_REGISTRY`, else `sqlite:///registry/archspec.db` (relative to the working directory)."""
    return os.environ.get("ARCHSPEC_REGISTRY") or DEFAULT_URL


class RegistryBusyError(RuntimeError):
    """The database stayed busy (locked, serialization failures, lost connections) through every retry."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


# ── values: flattening and typing ────────────────────────────────────────────────────────────────────────────────


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts → dotted keys; lists stay values (`train.data.corpus.paths`)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def typed_value(value: Any) -> tuple[str, float | None, str | None]:
    """(kind, value_num, value_str): numbers go to value_num so they compare numerically; bool before int."""
    if isinstance(value, bool):
        return "bool", None, "true" if value else "false"
    if isinstance(value, int):
        return "int", float(value), None
    if isinstance(value, float):
        return "float", (None if math.isnan(value) else value), None
    if isinstance(value, str):
        return "str", None, value
    if value is None:
        return "null", None, None
    return "json", None, json.dumps(value, sort_keys=True, separators=(",", ":"))


_ACCOUNTING_RENAMES = {"flops_per_token": "flops", "kv_cache_bytes_per_token": "kv_cache_bytes"}


def accounting_fields(accounting: Mapping[str, Any]) -> dict[str, int | float]:
    """`RunInfo.accounting` → its filter fields (params.*, flops.*, kv_cache_bytes) with their exact values."""
    out: dict[str, int | float] = {}
    for key, value in flatten(accounting).items():
        head, dot, rest = key.partition(".")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[_ACCOUNTING_RENAMES.get(head, head) + dot + rest] = value
    return out


def _canonical(spec_json: Mapping[str, Any]) -> str:
    # The same form as archspec.spec.canonical_json, from the dict the loop hands over in RunInfo.
    return json.dumps(spec_json, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def run_params(spec_json: Mapping[str, Any], recipe: Mapping[str, Any]) -> dict[str, Any]:
    """A run's params: its spec's keys, with `train.*` overlaid by the recipe actually used."""
    params = flatten(spec_json)
    params.update(flatten(recipe, "train."))
    return params


# ── engine: URL checks, SQLite pragmas, retries ──────────────────────────────────────────────────────────────────


def _normalize_url(url: str):
    try:
        u = make_url(url)
    except ArgumentError:
        raise UserError(
            f"invalid registry URL {url!r}: expected a SQLAlchemy URL such as sqlite:///registry/archspec.db "
            "or postgresql+psycopg://user@host/db"
        ) from None
    if u.drivername == "postgresql":
        # SQLAlchemy's default PostgreSQL driver is psycopg2; archspec's postgres extra installs psycopg 3.
        try:
            import psycopg2  # noqa: F401
        except ImportError:
            u = u.set(drivername="postgresql+psycopg")
    return u


def _sqlite_file(u) -> Path | None:
    db = u.database
    if not db or db == ":memory:" or db.startswith("file:") or u.query.get("mode") == "memory":
        return None
    return Path(db)


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised by every SQLite test
        # Take transaction control away from the sqlite3 module (its implicit BEGIN is always DEFERRED).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if wal and cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            cur.execute("PRAGMA journal_mode = WAL")  # persistent: set once per database file
        # In WAL mode NORMAL is safe against a killed process (kill -9 loses nothing committed); only a power loss
        # can undo the last commits. FULL would fsync every metric flush.
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        mode = "IMMEDIATE" if conn.get_execution_options().get("archspec_write") else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")


def _is_transient(exc: BaseException) -> bool:
    """Worth retrying: SQLite busy/locked; PostgreSQL serialization failure, deadlock, lock timeout, or a connection
    lost mid-session. A connection that cannot be made at all (bad host, bad password) is not: it is reported."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    if isinstance(orig, sqlite3.OperationalError):
        msg = str(orig).lower()
        return "locked" in msg or "busy" in msg
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return sqlstate in ("40001", "40P01", "55P03", "57P01")


@dataclass
class RetryPolicy:
    """Bounded retries: `attempts` tries, backoff from `base_s` doubling to `max_s`, jittered ×[0.5, 1.5]."""

    attempts: int = 10
    base_s: float = 0.05
    max_s: float = 2.0

    def delays(self) -> Iterator[float]:
        for i in range(self.attempts - 1):
            yield min(self.max_s, self.base_s * 2**i) * random.uniform(0.5, 1.5)


T = TypeVar("T")


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
    """Parsed spec JSON and accounting per spec hash, shared by all rows of one query (many runs share a spec)."""

    def __init__(self) -> None:
        self.raw: dict[str, tuple[str, str]] = {}  # hash → (canonical_json, accounting_json)
        self.parsed: dict[str, tuple[dict, dict, dict]] = {}  # hash → (spec, accounting, accounting fields)

    def get(self, spec_hash: str) -> tuple[dict, dict, dict]:
        if spec_hash not in self.parsed:
            canonical, accounting = self.raw.get(spec_hash, ("{}", "{}"))
            acct = json.loads(accounting)
            self.parsed[spec_hash] = (json.loads(canonical), acct, accounting_fields(acct))
        return self.parsed[spec_hash]


@dataclass
class SpecRow:
    """A recorded spec with its accounting."""

    hash: str
    name: str
    generated_hash: str | None
    created: datetime
    n_runs: int
    _cache: _SpecCache = field(repr=False)

    @property
    def spec(self) -> dict[str, Any]:
        return self._cache.get(self.hash)[0]

    @property
    def accounting(self) -> dict[str, Any]:
        return self._cache.get(self.hash)[1]

    @property
    def params(self) -> dict[str, Any]:
        return flatten(self.spec)

    def get(self, name: str) -> Any:
        """The value of a filter/sort field (`params.active`, `params.model.d_model`, `name`)."""
        ref = resolve_field(name, "specs")
        if ref.kind == "attr":
            return getattr(self, "hash" if ref.key == "spec_hash" else ref.key)
        if ref.kind == "acct":
            return self._cache.get(self.hash)[2].get(ref.key)
        return self.params.get(ref.key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hash": self.hash, "name": self.name, "generated_hash": self.generated_hash,
            "created": self.created.isoformat() if self.created else None, "runs": self.n_runs,
            "accounting": self.accounting, "spec": self.spec,
        }

    def flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hash": self.hash, "name": self.name, "generated_hash": self.generated_hash,
                               "created": self.created, "runs": self.n_runs}
        out.update(self._cache.get(self.hash)[2])
        out.update({f"params.{k}": v for k, v in self.params.items()})
        return out


@dataclass
class RunRow:
    """A run as the registry sees it: attributes, accounting of its spec, latest/best metrics, summary, tags."""

    id: str
    name: str
    status: str
    spec_hash: str
    data_hash: str
    seed: int
    sweep: str | None
    host: str
    code_version: str
    error: str | None
    created: datetime
    started: datetime | None
    ended: datetime | None
    heartbeat: datetime | None
    attempt: int
    recipe_json: str = field(repr=False)
    metrics: dict[str, float] = field(default_factory=dict)  # latest value per key
    best: dict[str, float] = field(default_factory=dict)  # lowest value per key
    max: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # last step per key
    summary: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    _cache: _SpecCache = field(default_factory=_SpecCache, repr=False)

    @property
    def spec(self) -> dict[str, Any]:
        return self._cache.get(self.spec_hash)[0]

    @property
    def accounting(self) -> dict[str, Any]:
        return self._cache.get(self.spec_hash)[1]

    @cached_property
    def recipe(self) -> dict[str, Any]:
        """The train recipe actually used (parsed on first use: listing 10,000 runs rarely needs it)."""
        return json.loads(self.recipe_json)

    @property
    def params(self) -> dict[str, Any]:
        return run_params(self.spec, self.recipe)

    @property
    def duration_s(self) -> float | None:
        end = self.ended or self.heartbeat
        return (end - self.started).total_seconds() if self.started and end else None

    def get(self, name: str) -> Any:
        """The value of a filter/sort field (`metrics.val_loss`, `params.active`, `status`, ...)."""
        ref = resolve_field(name, "runs")
        if ref.kind == "attr":
            return getattr(self, ref.key)
        if ref.kind == "acct":
            return self._cache.get(self.spec_hash)[2].get(ref.key)
        if ref.kind == "param":
            return self.params.get(ref.key)
        if ref.kind == "metric":
            return {"last": self.metrics, "min": self.best, "max": self.max}[ref.aggregate].get(ref.key)
        if ref.kind == "summary":
            return self.summary.get(ref.key)
        return self.tags.get(ref.key)

    def to_dict(self) -> dict[str, Any]:
        def iso(t: datetime | None) -> str | None:
            return t.isoformat() if t else None

        return {
            "id": self.id, "name": self.name, "status": self.status, "sweep": self.sweep, "seed": self.seed,
            "spec_hash": self.spec_hash, "data_hash": self.data_hash, "host": self.host,
            "code_version": self.code_version, "attempt": self.attempt, "created": iso(self.created),
            "started": iso(self.started), "ended": iso(self.ended), "heartbeat": iso(self.heartbeat),
            "error": self.error, "accounting": self.accounting, "recipe": self.recipe, "metrics": self.metrics,
            "best": self.best, "max": self.max, "steps": self.steps, "summary": self.summary, "tags": self.tags,
        }

    def flat(self, params: bool = True) -> dict[str, Any]:
        """One flat record (CSV, pandas): attributes, accounting, metrics, summary, tags and (optionally) params."""
        out: dict[str, Any] = {
            k: getattr(self, k) for k in ("id", "name", "status", "sweep", "seed", "spec_hash", "data_hash", "host",
                                          "code_version", "attempt", "created", "started", "ended", "error")
        }
        out.update(self._cache.get(self.spec_hash)[2])
        out.update({f"metrics.{k}": v for k, v in self.metrics.items()})
        out.update({f"metrics.best.{k}": v for k, v in self.best.items()})
        out.update({f"summary.{k}": v for k, v in self.summary.items()})
        out.update({f"tags.{k}": v for k, v in self.tags.items()})
        if params:
            out.update({f"params.{k}": v for k, v in self.params.items()})
        return out


@dataclass(frozen=True)
class MetricPoint:
    step: int
    value: float
    time: float


def _nan_if_none(v: float | None) -> float:
    return float("nan") if v is None else v


# ── the registry ─────────────────────────────────────────────────────────────────────────────────────────────────


class Registry:
    """A registry database. Opening one migrates it to the current schema (once, under a lock) or refuses it when
    its schema is newer than this code.

    `url`: any SQLAlchemy URL; None means `default_url()`. A SQLite file's parent directory is created.
    `busy_timeout_s`: how long one SQLite statement waits for a lock before the retry policy takes over.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        busy_timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
        echo: bool = False,
    ):
        raw = url or default_url()
        u = _normalize_url(raw)
        self.url = u.render_as_string(hide_password=True)
        self.retry = retry or RetryPolicy()
        self.dialect = u.get_backend_name()
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "sqlite":
            path = _sqlite_file(u)
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise UserError(f"registry {self.url}: cannot create directory {path.parent}: {e}") from None
            kwargs["connect_args"] = {"check_same_thread": False}
        else:
            kwargs["pool_pre_ping"] = True
        try:
            self.engine = create_engine(u, **kwargs)
        except (NoSuchModuleError, ImportError) as e:
            hint = " (pip install 'archspec[postgres]')" if self.dialect == "postgresql" else ""
            raise UserError(f"registry {self.url}: no database driver for this URL{hint}: {e}") from None
        except ArgumentError as e:
            raise UserError(f"invalid registry URL {self.url}: {e}") from None
        if self.dialect == "sqlite":
            _install_sqlite_hooks(self.engine, int(busy_timeout_s * 1000), wal=_sqlite_file(u) is not None)
        _OPEN.add(self)
        try:
            self.schema_revision = self._retrying(lambda: migrate.ensure_schema(self.engine, self.url), "migrate")
        except UserError:
            self.engine.dispose()
            raise
        except (DBAPIError, RegistryBusyError) as e:
            self.engine.dispose()
            orig = getattr(e, "orig", None) or e.__cause__ or e
            raise UserError(f"cannot open registry {self.url}: {str(orig).strip().splitlines()[0]}") from None

    # plumbing

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Registry({self.url!r})"

    def _now(self) -> datetime:
        return _utcnow()

    def _retrying(self, fn: Callable[[], T], what: str) -> T:
        delays = self.retry.delays()
        start = time.monotonic()
        while True:
            try:
                return fn()
            except DBAPIError as e:
                if not _is_transient(e):
                    raise
                delay = next(delays, None)
                if delay is None:
                    raise RegistryBusyError(
                        f"registry {self.url}: {what} gave up after {self.retry.attempts} attempts over "
                        f"{time.monotonic() - start:.1f}s: {str(e.orig).strip()}"
                    ) from e
                log.debug("registry %s busy during %s (%s); retrying in %.2fs", self.url, what, e.orig, delay)
                time.sleep(delay)

    def _write(self, fn: Callable[[Connection], T], what: str) -> T:
        """Run `fn` in one write transaction (BEGIN IMMEDIATE on SQLite), retried while the database is busy."""

        def attempt() -> T:
            with self.engine.connect().execution_options(archspec_write=True) as conn:
                with conn.begin():
                    return fn(conn)

        return self._retrying(attempt, what)

    def _read(self, fn: Callable[[Connection], T], what: str) -> T:
        def attempt() -> T:
            with self.engine.connect() as conn:
                with conn.begin():
                    return fn(conn)

        return self._retrying(attempt, what)

    # specs

    def record_spec(self, spec, generated_hash: str | None, accounting: Mapping[str, Any]) -> str:
        """Record a spec (an `archspec.spec.Spec`) with its accounting; idempotent. Returns the spec hash.

        Recording the same spec again refreshes its generated-source hash and accounting (they follow the code
        version that built it last), and leaves everything else alone.
        """
        from archspec.spec import canonical_dict, canonical_json, spec_hash

        data = canonical_dict(spec)
        h = spec_hash(spec)
        self._write(
            lambda conn: self._upsert_spec(conn, h, data, canonical_json(spec), generated_hash, accounting),
            "record_spec",
        )
        return h

    def _upsert_spec(
        self,
        conn: Connection,
        h: str,
        data: Mapping[str, Any],
        canonical: str,
        generated_hash: str | None,
        accounting: Mapping[str, Any],
    ) -> None:
        acct_json = json.dumps(accounting, sort_keys=True)
        row = conn.execute(
            select(SpecRecord.generated_hash, SpecRecord.accounting_json).where(SpecRecord.hash == h)
        ).first()
        if row is None:
            conn.execute(insert(SpecRecord).values(
                hash=h, name=str(data.get("name", "")), canonical_json=canonical, generated_hash=generated_hash,
                accounting_json=acct_json, created=self._now(),
            ))
            params = [{"spec_hash": h, "key": k, **_typed_row(v)} for k, v in flatten(data).items()]
            if params:
                conn.execute(insert(SpecParam), params)
        elif row.generated_hash == (generated_hash or row.generated_hash) and row.accounting_json == acct_json:
            return
        else:
            conn.execute(update(SpecRecord).where(SpecRecord.hash == h).values(
                generated_hash=generated_hash or row.generated_hash, accounting_json=acct_json))
            conn.execute(delete(SpecAccounting).where(SpecAccounting.spec_hash == h))
        acct = [{"spec_hash": h, "key": k, "value": float(v)} for k, v in accounting_fields(accounting).items()]
        if acct:
            conn.execute(insert(SpecAccounting), acct)

    # runs: writing (used by RegistryLogger; public so that other writers can use them too)

    def schedule_run(self, info: RunInfo) -> str:
        """Record a run as SCHEDULED (a sweep's plan) unless it already exists; returns its id."""

        def tx(conn: Connection) -> str:
            self._upsert_spec(conn, info.spec_hash, info.spec_json, _canonical(info.spec_json), info.generated_hash,
                              info.accounting)
            if conn.execute(select(RunRecord.id).where(RunRecord.id == info.run_id)).first() is None:
                self._insert_run(conn, info, SCHEDULED, heartbeat_timeout_s=0.0)
            return info.run_id

        return self._write_once_more_on_conflict(tx, "schedule_run")

    def _write_once_more_on_conflict(self, fn: Callable[[Connection], T], what: str) -> T:
        # Two processes inserting the same spec or run at once: the loser's transaction fails on the primary key;
        # run it again and it finds the row.
        try:
            return self._write(fn, what)
        except IntegrityError:
            return self._write(fn, what)

    def _insert_run(self, conn: Connection, info: RunInfo, status: str, heartbeat_timeout_s: float) -> None:
        now = self._now()
        running = status == RUNNING
        conn.execute(insert(RunRecord).values(
            id=info.run_id, spec_hash=info.spec_hash, name=info.spec_name, data_hash=info.data_hash,
            seed=int(info.seed), recipe_json=json.dumps(info.recipe, sort_keys=True, default=str),
            code_version=info.code_version or "", status=status, sweep=info.sweep, host=info.host or "",
            error=None, created=now, started=now if running else None, ended=None,
            heartbeat=now if running else None, heartbeat_timeout_s=heartbeat_timeout_s, attempt=1,
        ))
        self._write_params_and_tags(conn, info)

    def _write_params_and_tags(self, conn: Connection, info: RunInfo) -> None:
        params = [{"run_id": info.run_id, "key": k, **_typed_row(v)}
                  for k, v in run_params(info.spec_json, info.recipe).items()]
        if params:
            conn.execute(insert(RunParam), params)
        tags = [{"run_id": info.run_id, "key": k, "value": str(v)} for k, v in (info.tags or {}).items()]
        if tags:
            conn.execute(insert(RunTag), tags)

    def start_run(self, info: RunInfo, *, heartbeat_timeout_s: float, rerun_finished: bool = False) -> int:
        """Mark a run RUNNING (creating it, or restarting a SCHEDULED/FAILED/KILLED one); returns its attempt number.

        A restart is a new attempt (`attempt` + 1) that keeps the earlier attempts' metric history until it writes
        its own: its first `write_metrics(..., replace_from_step=...)` deletes every point at or after its first
        step. A restart from scratch (step 0) so replaces the whole history, and a run resumed from a checkpoint at
        step k keeps steps < k. The summary is cleared (it belongs to an attempt that ended); artifacts stay (their
        files, checkpoints above all, still exist). A FINISHED run raises `RunFinishedError` unless
        `rerun_finished`; a RUNNING run whose heartbeat is fresh raises `RunActiveError`.
        """

        def tx(conn: Connection) -> int:
            self._upsert_spec(conn, info.spec_hash, info.spec_json, _canonical(info.spec_json), info.generated_hash,
                              info.accounting)
            q = select(RunRecord).where(RunRecord.id == info.run_id)
            if conn.dialect.name == "postgresql":
                q = q.with_for_update()
            row = conn.execute(q).first()
            if row is None:
                self._insert_run(conn, info, RUNNING, heartbeat_timeout_s)
                return 1
            now = self._now()
            if row.status == FINISHED and not rerun_finished:
                raise RunFinishedError(
                    f"run {row.id} ({row.name}, seed {row.seed}) already FINISHED at {_fmt_time(row.ended)}; "
                    "Registry.run_status() tells a sweep to skip it"
                )
            if row.status == RUNNING and not self._is_stale(row, now):
                age = (now - row.heartbeat).total_seconds() if row.heartbeat else float("nan")
                raise RunActiveError(
                    f"run {row.id} ({row.name}) is already RUNNING on {row.host or 'an unknown host'} "
                    f"(last heartbeat {age:.0f}s ago)"
                )
            for table in (SummaryMetric, RunParam, RunTag):
                conn.execute(delete(table).where(table.run_id == info.run_id))
            attempt = row.attempt if (row.status == SCHEDULED and row.started is None) else row.attempt + 1
            conn.execute(update(RunRecord).where(RunRecord.id == info.run_id).values(
                status=RUNNING, attempt=attempt, started=now, ended=None, heartbeat=now, error=None,
                heartbeat_timeout_s=heartbeat_timeout_s, host=info.host or "", code_version=info.code_version or "",
                sweep=info.sweep, recipe_json=json.dumps(info.recipe, sort_keys=True, default=str),
                spec_hash=info.spec_hash, name=info.spec_name,
            ))
            self._write_params_and_tags(conn, info)
            return attempt

        return self._write_once_more_on_conflict(tx, "start_run")

    def _alive(self, conn: Connection, run_id: str, attempt: int, now: datetime) -> bool:
        """Heartbeat inside a write: True while this attempt still owns the run.

        A run a reader marked KILLED for a missed heartbeat comes back to RUNNING when its writer turns out to be
        alive after all; a run that a newer attempt took over does not (rowcount 0).
        """
        res = conn.execute(
            update(RunRecord)
            .where(RunRecord.id == run_id, RunRecord.attempt == attempt, RunRecord.status.in_((RUNNING, KILLED)))
            .values(heartbeat=now, status=RUNNING, ended=None, error=None)
        )
        return res.rowcount == 1

    def beat(self, run_id: str, attempt: int) -> bool:
        return self._write(lambda conn: self._alive(conn, run_id, attempt, self._now()), "heartbeat")

    def write_metrics(self, run_id: str, attempt: int, points: Sequence[tuple[int, str, float, float]],
                      replace_from_step: int | None = None) -> bool:
        """Append metric points (step, key, value, unix time) and update metric_stats, in one transaction that also
        beats the heartbeat. Returns False (and writes nothing) when a newer attempt owns the run.

        `replace_from_step`: first delete the run's points at or after this step (a restarted attempt's first write,
        see `start_run`) and recompute metric_stats from what remains."""

        def tx(conn: Connection) -> bool:
            if not self._alive(conn, run_id, attempt, self._now()):
                return False
            if replace_from_step is not None:
                self._truncate_history(conn, run_id, replace_from_step)
            if not points:
                return True
            conn.execute(insert(Metric), [
                {"run_id": run_id, "key": k, "step": s, "value": (None if math.isnan(v) else v), "time": t}
                for s, k, v, t in points
            ])
            self._update_stats(conn, run_id, points)
            return True

        return self._write(tx, "write_metrics")

    def _truncate_history(self, conn: Connection, run_id: str, from_step: int) -> None:
        res = conn.execute(delete(Metric).where(Metric.run_id == run_id, Metric.step >= from_step))
        if not res.rowcount:
            return
        conn.execute(delete(MetricStats).where(MetricStats.run_id == run_id))
        agg = conn.execute(
            select(Metric.key, func.count(), func.min(Metric.value), func.max(Metric.value), func.max(Metric.step))
            .where(Metric.run_id == run_id).group_by(Metric.key)
        ).all()
        rows = []
        for key, count, lo, hi, last_step in agg:
            last = conn.execute(
                select(Metric.value).where(Metric.run_id == run_id, Metric.key == key, Metric.step == last_step)
                .order_by(Metric.id.desc()).limit(1)
            ).scalar()
            rows.append({"run_id": run_id, "key": key, "last_step": last_step, "last_value": last,
                         "min_value": lo, "max_value": hi, "count": count})
        if rows:
            conn.execute(insert(MetricStats), rows)

    def _update_stats(self, conn: Connection, run_id: str, points: Sequence[tuple[int, str, float, float]]) -> None:
        new: dict[str, dict[str, Any]] = {}
        for step, key, value, _ in points:  # points arrive in logging order: the last one of a step wins
            st = new.setdefault(key, {"last_step": step, "last_value": value, "min": None, "max": None, "count": 0})
            if step >= st["last_step"]:
                st["last_step"], st["last_value"] = step, value
            st["count"] += 1
            if not math.isnan(value):
                st["min"] = value if st["min"] is None else min(st["min"], value)
                st["max"] = value if st["max"] is None else max(st["max"], value)
        old = {
            r.key: r for r in conn.execute(
                select(MetricStats).where(MetricStats.run_id == run_id, MetricStats.key.in_(list(new)))
            )
        }
        inserts = []
        for key, st in new.items():
            last_value = None if math.isnan(st["last_value"]) else st["last_value"]
            prev = old.get(key)
            if prev is None:
                inserts.append({"run_id": run_id, "key": key, "last_step": st["last_step"], "last_value": last_value,
                                "min_value": st["min"], "max_value": st["max"], "count": st["count"]})
                continue
            values: dict[str, Any] = {"count": prev.count + st["count"]}
            if st["last_step"] >= prev.last_step:
                values.update(last_step=st["last_step"], last_value=last_value)
            lo = [v for v in (prev.min_value, st["min"]) if v is not None]
            hi = [v for v in (prev.max_value, st["max"]) if v is not None]
            values.update(min_value=min(lo) if lo else None, max_value=max(hi) if hi else None)
            conn.execute(
                update(MetricStats).where(MetricStats.run_id == run_id, MetricStats.key == key).values(**values)
            )
        if inserts:
            conn.execute(insert(MetricStats), inserts)

    def set_summary(self, run_id: str, metrics: Mapping[str, float]) -> None:
        def tx(conn: Connection) -> None:
            keys = list(metrics)
            conn.execute(delete(SummaryMetric).where(SummaryMetric.run_id == run_id, SummaryMetric.key.in_(keys)))
            if keys:
                conn.execute(insert(SummaryMetric), [
                    {"run_id": run_id, "key": k, "value": None if math.isnan(v) else v}
                    for k, v in ((k, float(v)) for k, v in metrics.items())
                ])

        self._write(tx, "set_summary")

    def add_artifact(self, run_id: str, kind: str, path: str) -> None:
        """Record a file once per (run, kind, path): a resumed run re-announces its module and checkpoint."""
        def tx(conn: Connection) -> None:
            known = conn.execute(select(Artifact.id).where(
                Artifact.run_id == run_id, Artifact.kind == kind, Artifact.path == str(path))).first()
            if known is None:
                conn.execute(insert(Artifact).values(run_id=run_id, kind=kind, path=str(path), created=self._now()))

        self._write(tx, "log_artifact")

    def finish_run(self, run_id: str, attempt: int, status: str, error: str | None = None) -> bool:
        """Set the final status of this attempt. False when a newer attempt owns the run."""
        if status not in (FINISHED, FAILED, KILLED):
            raise ValueError(f"final status must be FINISHED, FAILED or KILLED, got {status!r}")

        def tx(conn: Connection) -> bool:
            now = self._now()
            res = conn.execute(
                update(RunRecord)
                .where(RunRecord.id == run_id, RunRecord.attempt == attempt)
                .values(status=status, ended=now, heartbeat=now, error=error)
            )
            return res.rowcount == 1

        return self._write(tx, "end_run")

    # liveness

    def _is_stale(self, row, now: datetime, timeout_s: float | None = None) -> bool:
        limit = row.heartbeat_timeout_s if timeout_s is None else timeout_s
        return row.heartbeat is None or (now - row.heartbeat).total_seconds() > limit

    def mark_stale_killed(self, timeout_s: float | None = None) -> list[str]:
        """Mark KILLED every RUNNING run whose last heartbeat is older than its writer's timeout (or `timeout_s`).

        Every read calls this first, so a dead run shows as KILLED to the next reader. The update re-checks the
        heartbeat, so a run that beat in between is left alone. Returns the ids marked.
        """
        now = self._now()
        rows = self._read(
            lambda conn: conn.execute(
                select(RunRecord.id, RunRecord.heartbeat, RunRecord.heartbeat_timeout_s, RunRecord.attempt)
                .where(RunRecord.status == RUNNING)
            ).all(),
            "find stale runs",
        )
        stale = [r for r in rows if self._is_stale(r, now, timeout_s)]
        if not stale:
            return []

        def tx(conn: Connection) -> list[str]:
            marked = []
            for r in stale:
                limit = r.heartbeat_timeout_s if timeout_s is None else timeout_s
                cutoff = now - timedelta(seconds=limit)
                res = conn.execute(
                    update(RunRecord)
                    .where(RunRecord.id == r.id, RunRecord.status == RUNNING, RunRecord.attempt == r.attempt,
                           (RunRecord.heartbeat.is_(None)) | (RunRecord.heartbeat < cutoff))
                    .values(status=KILLED, ended=r.heartbeat or now,
                            error=f"no heartbeat since {_fmt_time(r.heartbeat)} (timeout {limit:g}s): "
                                  "the process died or was killed")
                )
                if res.rowcount:
                    marked.append(r.id)
            return marked

        try:
            return self._write(tx, "mark stale runs KILLED")
        except (DBAPIError, RegistryBusyError) as e:
            # A reader without write access (or a very busy database) still reads; the next reader will try again.
            log.warning("registry %s: could not mark stale runs KILLED: %s", self.url, e)
            return []

    # reading

    def run_status(self, run_id: str) -> str | None:
        """The run's status (after marking it KILLED if its heartbeat is stale); None when it is not recorded."""
        self.mark_stale_killed()
        return self._read(
            lambda conn: conn.execute(select(RunRecord.status).where(RunRecord.id == run_id)).scalar(), "run_status"
        )

    def runs(self, where: str | None = None, sort: str | None = None, limit: int | None = None) -> QueryResult[RunRow]:
        """Runs matching a filter (see archspec.registry.query), sorted (default: newest first); `limit` None or 0:
        all. Reaps stale RUNNING runs first, so a dead run shows as KILLED."""
        cond = compile_filter(where, "runs")
        order = compile_sort(sort, "runs")
        if limit is not None and limit < 0:
            raise UserError(f"--limit must be >= 0, got {limit}")
        self.mark_stale_killed()
        q = select(RunRecord).where(cond).order_by(*order, RunRecord.created.desc(), RunRecord.id)
        if limit:
            q = q.limit(limit)
        return self._read(lambda conn: self._load_runs(conn, q), "runs")

    def _load_runs(self, conn: Connection, q) -> QueryResult[RunRow]:
        cache = _SpecCache()
        rows: list[RunRow] = [
            RunRow(
                id=r.id, name=r.name, status=r.status, spec_hash=r.spec_hash, data_hash=r.data_hash, seed=r.seed,
                sweep=r.sweep, host=r.host, code_version=r.code_version, error=r.error, created=r.created,
                started=r.started, ended=r.ended, heartbeat=r.heartbeat, attempt=r.attempt,
                recipe_json=r.recipe_json, _cache=cache,
            )
            for r in conn.execute(q).all()  # fetchall: row-by-row fetching costs a third of a 10,000-run listing
        ]
        by_id = {row.id: row for row in rows}
        for chunk in _chunks(list({row.spec_hash for row in rows})):
            for h, canonical, acct in conn.execute(
                select(SpecRecord.hash, SpecRecord.canonical_json, SpecRecord.accounting_json)
                .where(SpecRecord.hash.in_(chunk))
            ).all():
                cache.raw[h] = (canonical, acct)
        stats = select(MetricStats.run_id, MetricStats.key, MetricStats.last_step, MetricStats.last_value,
                       MetricStats.min_value, MetricStats.max_value)
        for chunk in _chunks(list(by_id)):
            for run_id, key, last_step, last, lo, hi in conn.execute(stats.where(MetricStats.run_id.in_(chunk))).all():
                row = by_id[run_id]
                row.metrics[key] = _nan_if_none(last)
                row.steps[key] = last_step
                if lo is not None:
                    row.best[key] = lo
                if hi is not None:
                    row.max[key] = hi
            for run_id, key, value in conn.execute(
                select(SummaryMetric.run_id, SummaryMetric.key, SummaryMetric.value)
                .where(SummaryMetric.run_id.in_(chunk))
            ).all():
                by_id[run_id].summary[key] = _nan_if_none(value)
            for run_id, key, value in conn.execute(
                select(RunTag.run_id, RunTag.key, RunTag.value).where(RunTag.run_id.in_(chunk))
            ).all():
                by_id[run_id].tags[key] = value
        return QueryResult(rows)

    def get_run(self, run_id: str) -> RunRow:
        """One run by id or by a unique id prefix (at least 4 characters); UserError when unknown or ambiguous."""
        run_id = run_id.strip()
        self.mark_stale_killed()

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
                short = " (an id prefix needs at least 4 characters)" if len(run_id) < 4 else ""
                raise UserError(f"no run {run_id!r} in registry {self.url}{short} (`archspec runs list` shows the runs)")
            return self._load_runs(conn, select(RunRecord).where(RunRecord.id == run_id))[0]

        return self._read(tx, "get_run")

    def metric_history(self, run_id: str, key: str) -> list[MetricPoint]:
        """Every point of one metric of a run, in step order (NaN where the value was NaN)."""
        return self._read(lambda conn: [
            MetricPoint(r.step, _nan_if_none(r.value), r.time)
            for r in conn.execute(
                select(Metric.step, Metric.value, Metric.time)
                .where(Metric.run_id == run_id, Metric.key == key)
                .order_by(Metric.step, Metric.id)
            )
        ], "metric_history")

    def metric_histories(self, run_id: str) -> dict[str, list[MetricPoint]]:
        """Every metric of a run: key → points in step order."""

        def tx(conn: Connection) -> dict[str, list[MetricPoint]]:
            out: dict[str, list[MetricPoint]] = {}
            for r in conn.execute(
                select(Metric.key, Metric.step, Metric.value, Metric.time)
                .where(Metric.run_id == run_id).order_by(Metric.key, Metric.step, Metric.id)
            ):
                out.setdefault(r.key, []).append(MetricPoint(r.step, _nan_if_none(r.value), r.time))
            return out

        return self._read(tx, "metric_histories")

    def artifacts(self, run_id: str) -> list[tuple[str, str]]:
        """(kind, path) of every artifact of a run, oldest first."""
        return self._read(lambda conn: [
            (r.kind, r.path) for r in conn.execute(
                select(Artifact.kind, Artifact.path).where(Artifact.run_id == run_id).order_by(Artifact.id))
        ], "artifacts")

    def count_metrics(self, run_id: str | None = None) -> int:
        """Number of stored metric points (of one run, or of all)."""
        q = select(func.count()).select_from(Metric)
        if run_id is not None:
            q = q.where(Metric.run_id == run_id)
        return self._read(lambda conn: int(conn.execute(q).scalar_one()), "count_metrics")

    def specs(
        self, where: str | None = None, sort: str | None = None, limit: int | None = None
    ) -> QueryResult[SpecRow]:
        """Recorded specs matching a filter over params and accounting (default: newest first)."""
        cond = compile_filter(where, "specs")
        order = compile_sort(sort, "specs")
        if limit is not None and limit < 0:
            raise UserError(f"--limit must be >= 0, got {limit}")
        n_runs = select(func.count()).where(RunRecord.spec_hash == SpecRecord.hash).scalar_subquery()
        q = (select(SpecRecord.hash, SpecRecord.name, SpecRecord.generated_hash, SpecRecord.created,
                    SpecRecord.canonical_json, SpecRecord.accounting_json, n_runs.label("n_runs"))
             .where(cond).order_by(*order, SpecRecord.created.desc(), SpecRecord.hash))
        if limit:
            q = q.limit(limit)

        def tx(conn: Connection) -> QueryResult[SpecRow]:
            cache = _SpecCache()
            out: QueryResult[SpecRow] = QueryResult()
            for r in conn.execute(q):
                cache.raw[r.hash] = (r.canonical_json, r.accounting_json)
                out.append(SpecRow(r.hash, r.name, r.generated_hash, r.created, int(r.n_runs), cache))
            return out

        return self._read(tx, "specs")


class RunFinishedError(UserError):
    """The run already FINISHED; a sweep skips it (see Registry.run_status), a rerun must be asked for."""


class RunActiveError(UserError):
    """Another live process is running this run (its heartbeat is fresh)."""


def _typed_row(value: Any) -> dict[str, Any]:
    kind, num, text = typed_value(value)
    return {"kind": kind, "value_num": num, "value_str": text}


def _chunks(items: Sequence[T], n: int = _CHUNK) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _fmt_time(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t else "never"
