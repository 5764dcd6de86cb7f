"""Schema migrations, run programmatically with alembic before any worker writes.

Reading never migrates: a reader accepts the head revision and any older one whose later migrations leave the
tables' shape alone (a revision module says so with `SHAPE_CHANGE = False`, e.g. one that only adds indexes), and
refuses the rest with `SchemaTooOldError`, naming `archspec registry upgrade`.

`ensure_schema(engine)` is called by the first write of a `Registry` (and by `archspec registry upgrade`): a fast
read of the stored revision, and only when it is behind, an upgrade to head under a database-wide lock (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: a transaction-scoped
advisory lock), so that several workers opening a fresh database at once migrate it exactly once. A database whose
revision this code does not know was written by a newer archspec and is refused, never touched.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from archspec.errors import UserError

if TYPE_CHECKING:  # alembic is imported where a revision is read or a migration runs, not with the registry
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# Our own name, so that a registry can share a database with another alembic-managed application.
VERSION_TABLE = "archspec_alembic_version"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Arbitrary constant: the PostgreSQL advisory lock key that serialises archspec migrations.
_PG_LOCK_KEY = 0x61726368  # "arch"


class SchemaTooNewError(UserError):
    """The database was migrated by a newer archspec than this one."""


class SchemaDamagedError(UserError):
    """The tables are not the shape of archspec's schema (a table or column dropped by something else)."""


class SchemaTooOldError(UserError):
    """The database's schema is older than this code reads; `archspec registry upgrade` brings it to head."""


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@lru_cache(maxsize=1)
def _script() -> ScriptDirectory:
    # The revision files do not change while the process runs; reading them once keeps Registry() cheap.
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


@dataclass(frozen=True)
class _Revision:
    revision: str
    shape_change: bool  # the module's SHAPE_CHANGE, True when it does not say


@lru_cache(maxsize=1)
def _chain() -> tuple[_Revision, ...]:
    """The revisions head first, read without alembic when the migrations are one plain chain (each file assigning
    string constants to `revision` and `down_revision`, and at most a boolean to `SHAPE_CHANGE`): reading a
    registry then needs no alembic import. Anything else (a branch, a merge, a computed value) is left to alembic's
    ScriptDirectory, which is what migrations run with; tests/test_startup.py keeps both equal."""
    found: dict[str, tuple[str | None, bool]] = {}
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        if path.name.startswith((".#", "__init__")):
            continue
        values: dict[str, object] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if name in ("revision", "down_revision", "SHAPE_CHANGE"):
                    if not isinstance(node.value, ast.Constant):
                        return _alembic_chain()
                    values[name] = node.value.value
        rev, down, shape = values.get("revision"), values.get("down_revision", None), values.get("SHAPE_CHANGE", True)
        if not isinstance(rev, str) or not isinstance(down, (str, type(None))) or not isinstance(shape, bool) \
                or rev in found:
            return _alembic_chain()
        found[rev] = (down, shape)
    children: dict[str | None, list[str]] = {}
    for rev, (down, _) in found.items():
        children.setdefault(down, []).append(rev)
    if any(len(c) > 1 for c in children.values()) or any(d is not None and d not in found for d in children):
        return _alembic_chain()
    chain, at = [], None
    while at in children:
        at = children[at][0]
        chain.append(_Revision(at, found[at][1]))
    if len(chain) != len(found):
        return _alembic_chain()
    return tuple(reversed(chain))


def _alembic_chain() -> tuple[_Revision, ...]:
    return tuple(_Revision(s.revision, getattr(s.module, "SHAPE_CHANGE", True)) for s in _script().walk_revisions())


def head_revision() -> str:
    chain = _chain()
    assert chain, "the registry has no migrations"
    return chain[0].revision


def known_revisions() -> set[str]:
    return {r.revision for r in _chain()}


def current_revision(conn: Connection) -> str | None:
    """The revision stored in the database; None for a database archspec never migrated. Read as alembic reads it
    (the version table, if there is one); alembic itself answers a table holding several heads (its error)."""
    if conn.dialect.has_table(conn, VERSION_TABLE):
        rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    else:
        rows = []
    if len(rows) <= 1:
        return rows[0] if rows else None
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision()


def readable_revisions() -> set[str]:
    """Head, and every older revision from which only shape-preserving migrations (`SHAPE_CHANGE = False`) lead."""
    out: set[str] = set()
    for script in _chain():  # head first
        out.add(script.revision)
        if script.shape_change:
            break
    return out


def check_readable(rev: str | None, url: str) -> None:
    """Refuse a schema this code cannot read as it is: newer than this code, or older with another shape."""
    check_not_newer(rev, url)
    if rev is not None and rev not in readable_revisions():
        raise SchemaTooOldError(
            f"registry {url}: its schema is at revision {rev}, older than this archspec reads (its newest is "
            f"{head_revision()}); nothing was changed. Run `archspec registry upgrade --registry {url}` to upgrade "
            "it (back the database up first: older archspec versions cannot read it afterwards)."
        )


def shape_problems(conn: Connection) -> list[str]:
    """What is missing from the database compared with the tables and columns archspec reads and writes (every readable
    revision has head's shape). Tables of other applications sharing the database are ignored."""
    from sqlalchemy import inspect

    from archspec.registry.models import Base

    insp = inspect(conn)
    present = set(insp.get_table_names())
    problems = []
    for table in Base.metadata.sorted_tables:
        if table.name not in present:
            problems.append(f"table {table.name} is missing")
            continue
        columns = {c["name"] for c in insp.get_columns(table.name)}
        missing = [c.name for c in table.columns if c.name not in columns]
        if missing:
            problems.append(f"table {table.name} lacks column{'s' * (len(missing) > 1)} {', '.join(missing)}")
    return problems


def check_not_newer(rev: str | None, url: str) -> None:
    if rev is not None and rev not in known_revisions():
        raise SchemaTooNewError(
            f"registry {url}: its schema is at revision {rev}, which this archspec does not know "
            f"(its newest is {head_revision()}); the database was written by a newer archspec. "
            "Upgrade archspec, or point --registry / ARCHSPEC_REGISTRY at another database."
        )


def ensure_schema(engine: Engine, url_for_messages: str) -> str:
    """Bring the database to head (once, under a lock) or refuse it if newer. Returns the head revision."""
    head = head_revision()
    with engine.connect() as conn:
        rev = current_revision(conn)
        conn.rollback()
    check_not_newer(rev, url_for_messages)
    if rev == head:
        return head
    # `archspec_write` makes SQLite open the transaction with BEGIN IMMEDIATE (see store._install_sqlite_hooks):
    # the write lock is taken before we look again, so a second migrator waits here and then finds head.
    with engine.connect().execution_options(archspec_write=True) as conn:
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            rev = current_revision(conn)
            check_not_newer(rev, url_for_messages)
            if rev != head:
                from alembic import command

                command.upgrade(alembic_config(conn), "head")
    return head
