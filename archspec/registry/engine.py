"""The registry's engine: opening a database, the schema check, transactions and their retries.

Every write is one short transaction, bounded by the database's lock wait (SQLite busy_timeout) and retried with
exponential backoff and jitter when the database says it is busy; SQLite runs in WAL mode so that readers never block
the writers. Write transactions on SQLite start with BEGIN IMMEDIATE: a deferred transaction that reads and then
writes can fail at once with SQLITE_BUSY without waiting, which is how "database is locked" escapes elsewhere.

Reads never write. Opening a registry only reads its schema revision (a SQLite file that does not exist is not
created); a read of a database that holds no registry yet finds nothing; a schema this code cannot read as it is
(older, with a different shape) is refused with the command that upgrades it. The first write of a `Registry`
creates the database or brings its schema to head, once, under a lock (`migrate.ensure_schema`).
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import time
import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from archspec.errors import UserError, printable, redact
from archspec.registry import migrate

log = logging.getLogger("archspec.registry")

DEFAULT_URL = "sqlite:///registry/archspec.db"  # the default under the state root (archspec.paths), as a relative URL
_CHUNK = 500  # ids per IN (...) list: far below SQLite's bound-variable limit on any version


# Every open registry, so that a forked child (a DataLoader worker, a sweep runner's fork) drops the pooled connections
# it inherited instead of sharing them with its parent (SQLAlchemy's advice for fork).
_OPEN: "weakref.WeakSet[RegistryEngine]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for reg in list(_OPEN):
        reg.engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def default_url() -> str:
    """`$ARCHSPEC_REGISTRY`, else `registry/archspec.db` under the state root (archspec.paths: $ARCHSPEC_HOME, the
    project root, or the per-user data directory), as an absolute SQLite URL."""
    from archspec.paths import default_registry_url

    return os.environ.get("ARCHSPEC_REGISTRY") or default_registry_url()


class RegistryBusyError(RuntimeError):
    """The database stayed busy (locked, serialization failures, lost connections) through every retry."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# ── engine: URL checks, SQLite pragmas, retries ──────────────────────────────────────────────────────────────────


def _normalize_url(url: str):
    try:
        str(url).encode("utf-8")
        u = make_url(url)
    except (ArgumentError, ValueError, UnicodeEncodeError) as e:  # a port that is not a number, bytes not UTF-8
        why = (" (not UTF-8 text)" if isinstance(e, UnicodeError) else
               f" ({printable(str(e), 120)})" if isinstance(e, ValueError) else "")
        raise UserError(
            f"invalid registry URL {printable(repr(url), 200)}{why}: expected a SQLAlchemy URL such as "
            "sqlite:///registry/archspec.db or postgresql+psycopg://user@host/db"
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


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised by every SQLite test
        # Take transaction control away from the sqlite3 module (its implicit BEGIN is always DEFERRED).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        # WAL is set once, by the first write (`_prepare_for_writes`): it is persistent, and a reader must not change
        # the file.
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


class RegistryEngine:
    """A registry database: its engine, schema state and transactions. `Registry` adds the writes and the reads.

    `url`: any SQLAlchemy URL; None means `default_url()`. A SQLite file (and its directory) is created by the first
    write, never by opening or reading.
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
        self.url = redact(u.render_as_string(hide_password=False))  # shown in every message: never its password
        self.retry = retry or RetryPolicy()
        self.dialect = u.get_backend_name()
        self._file = _sqlite_file(u) if self.dialect == "sqlite" else None
        self._writable = False  # schema brought to head by this object (first write)
        self._readable = False  # schema known readable by this code
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "sqlite":
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
            _install_sqlite_hooks(self.engine, int(busy_timeout_s * 1000))
        _OPEN.add(self)
        # Opening reads the stored revision (a read): a database that cannot be reached, is not a database, or was
        # written by a newer archspec is refused here, before anything else.
        self._guarded(lambda: migrate.check_not_newer(self._revision(), self.url), "open")

    # plumbing

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _now(self) -> datetime:
        return utcnow()

    def _guarded(self, fn: Callable[[], T], what: str) -> T:
        """`fn` with retries; a database that cannot be opened at all becomes a UserError naming the registry."""
        try:
            return self._retrying(fn, what)
        except UserError:
            raise
        except (DBAPIError, RegistryBusyError) as e:
            orig = getattr(e, "orig", None) or e.__cause__ or e
            raise UserError(f"cannot open registry {self.url}: {str(orig).strip().splitlines()[0]}") from None

    # schema

    def _exists(self) -> bool:
        """False for a SQLite file that is not there (connecting would create it)."""
        return self._file is None or self._file.exists()

    def _revision(self) -> str | None:
        """The stored schema revision; None when the database holds no registry (or does not exist)."""
        if not self._exists():
            return None
        with self.engine.connect() as conn:
            rev = migrate.current_revision(conn)
            conn.rollback()
        return rev

    @property
    def schema_revision(self) -> str | None:
        """The schema revision stored in the database now (None: no registry there yet)."""
        return self._guarded(self._revision, "schema revision")

    def _can_read(self) -> bool:
        """True when the schema is one this code reads; False when there is no registry yet (a read finds nothing).
        Raises `SchemaTooOldError` (naming `archspec registry upgrade`) for an older schema of another shape."""
        if self._readable or self._writable:
            return True
        rev = self._revision()
        if rev is None:
            return False
        migrate.check_readable(rev, self.url)
        self._check_shape(rev)
        self._readable = True
        return True

    def _check_shape(self, rev: str | None) -> None:
        """Refuse tables that are not archspec's at a revision this code reads (one dropped or altered by something
        else): every read would fail on them, and no write must go into them."""
        with self.engine.connect() as conn:
            problems = migrate.shape_problems(conn)
            conn.rollback()
        if problems:
            raise migrate.SchemaDamagedError(
                f"registry {self.url}: its tables are not archspec's schema (revision {rev}); something else changed "
                f"them: {'; '.join(problems)}. archspec will not write into it; restore it from a backup or point "
                "--registry / ARCHSPEC_REGISTRY at another database")

    def upgrade(self) -> tuple[str | None, str]:
        """Create the registry, or bring its schema to head (once, under a lock). Returns (revision before, after)."""
        before = self.schema_revision
        self._prepare_for_writes()
        return before, migrate.head_revision()

    def _prepare_for_writes(self) -> None:
        if self._writable:
            return
        if self._file is not None:
            from archspec.paths import announce

            announce(self._file.parent)
            try:
                self._file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(f"registry {self.url}: cannot create directory {self._file.parent}: {e}") from None

        def prepare() -> None:
            if self._file is not None:
                self._set_wal()
            rev = migrate.ensure_schema(self.engine, self.url)
            self._check_shape(rev)

        self._guarded(prepare, "migrate")
        self._writable = True

    def _set_wal(self) -> None:
        """WAL mode, persistent: set once per database file, outside any transaction (on the raw connection, whose
        errors SQLAlchemy does not wrap: a busy database is retried here)."""
        delays = self.retry.delays()
        while True:
            raw = self.engine.raw_connection()
            try:
                cur = raw.cursor()
                if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    cur.execute("PRAGMA journal_mode = WAL")
                cur.close()
                return
            except sqlite3.OperationalError as e:
                text = str(e).lower()
                if "locked" not in text and "busy" not in text:
                    raise UserError(f"cannot open registry {self.url}: {e}") from None
                delay = next(delays, None)
                if delay is None:
                    raise RegistryBusyError(f"registry {self.url}: setting WAL mode: {e}") from None
                time.sleep(delay)
            finally:
                raw.close()

    # transactions

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
        """Run `fn` in one write transaction (BEGIN IMMEDIATE on SQLite), retried while the database is busy. The
        first write of this object creates the database or brings its schema to head."""
        self._prepare_for_writes()

        def attempt() -> T:
            with self.engine.connect().execution_options(archspec_write=True) as conn:
                with conn.begin():
                    return fn(conn)

        return self._retrying(attempt, what)

    def _read(self, fn: Callable[[Connection], T], what: str, empty: Callable[[], T]) -> T:
        """Run `fn` in one read transaction; `empty()` when the database holds no registry yet (nothing is created)."""
        if not self._retrying(self._can_read, what):
            return empty()

        def attempt() -> T:
            with self.engine.connect() as conn:
                with conn.begin():
                    return fn(conn)

        return self._retrying(attempt, what)


def chunks(items: Sequence[T], n: int = _CHUNK) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def fmt_time(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t else "never"
