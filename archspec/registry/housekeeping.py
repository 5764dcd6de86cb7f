"""Housekeeping over many runs: deleting runs with their run directories (`archspec runs delete`) and freeing the
checkpoints of finished runs (`archspec gc`).

Files are touched only where the registry says they are and only when they are archspec's: a run directory is one
that holds the run's recorded module or checkpoint, lies where the run's artifacts say, and holds nothing but the
files a run writes (`RUN_FILES`); `gc` removes recorded checkpoint files of FINISHED runs and nothing else.

Removal is all or nothing for the user: files are first renamed aside (one atomic rename each, in place), then the
registry rows are deleted in one transaction, then the renamed files are removed. A failed transaction renames every
file back, so a run is either fully there (rows and files) or fully gone.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from archspec.errors import UserError, printable
from archspec.registry.reads import RunRow
from archspec.registry.store import Registry
from archspec.train.logger import FINISHED, RecordingError

# What a run directory holds when archspec wrote it (archspec.train: loop, checkpoint, tokenizer, run_dir, codegen),
# besides the run's recorded artifacts. Anything else there is the user's: the directory is not deleted.
RUN_FILES = ("checkpoint.pt", "tokenizer.json", "run.json", "metrics.jsonl", "__pycache__", "checkpoint-step*.dcp",
             ".*.tmp", "*.tmp[0-9]*", ".*.deleting-*")
KEEP_POLICIES = ("last", "best", "none")


def tree_size(path: Path) -> int:
    """Bytes under `path` (a file or a directory), symlinks not followed."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
    except OSError:
        return 0
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


# ── deleting runs ────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class RunDeletion:
    """What deleting one run removes: its registry rows, and its run directories (those on this host)."""

    run: RunRow
    dirs: list[Path] = field(default_factory=list)  # archspec's run directories, checked
    missing: list[Path] = field(default_factory=list)  # recorded, but not here (another host, or already gone)
    size: int = 0


def _is_archspec_file(name: str, recorded: set[str]) -> bool:
    return name in recorded or any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_FILES)


def plan_deletion(reg: Registry, runs: Sequence[RunRow], keep_files: bool = False) -> list[RunDeletion]:
    """Check every run's directory and say what deleting the runs removes; UserError (nothing removed) when a
    directory cannot be deleted safely: it holds files archspec did not write, another run's files, or the
    registry itself."""
    ids = {r.id for r in runs}
    all_artifacts = reg.all_artifacts()
    registry_file = getattr(reg, "_file", None)
    registry_file = Path(os.path.abspath(registry_file)) if registry_file is not None else None
    plans = []
    for run in runs:
        plan = RunDeletion(run)
        plans.append(plan)
        if keep_files:
            continue
        paths = [Path(p) for run_id, _, p in all_artifacts if run_id == run.id]
        plan.missing += [p for p in paths if not p.is_absolute()]  # recorded relative by an older archspec: unknown
        for d in dict.fromkeys(p.parent for p in paths if p.is_absolute()):
            where = printable(str(d), 200)
            if not d.exists() and not d.is_symlink():
                plan.missing.append(d)
                continue
            if d.is_symlink() or not d.is_dir():
                raise UserError(f"run {run.id}: {where} is not a directory (a link, or a file); archspec deletes only "
                                "run directories it created (--keep-files deletes the registry rows alone)")
            recorded = {p.name for p in paths if p.parent == d}
            if not any((d / name).is_file() for name in recorded):
                raise UserError(f"run {run.id}: {where} holds none of the run's recorded files (its module or "
                                "checkpoint); not deleting a directory archspec cannot tell is the run's "
                                "(--keep-files deletes the registry rows alone)")
            try:
                entries = sorted(os.listdir(d))
            except OSError as e:
                raise UserError(f"run {run.id}: cannot list {where}: {e.strerror}") from None
            foreign = [e for e in entries if not _is_archspec_file(e, recorded)]
            if foreign:
                shown = ", ".join(printable(f, 60) for f in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
                raise UserError(f"run {run.id}: {where} also holds files archspec did not write ({shown}); delete "
                                "or move them first, or pass --keep-files to delete the registry rows alone")
            others = sorted({rid for rid, _, p in all_artifacts if rid not in ids and Path(p).parent == d})
            if others:
                raise UserError(f"run {run.id}: {where} also holds the files of run {others[0]}"
                                f"{f' (and {len(others) - 1} more)' if len(others) > 1 else ''}; delete those runs "
                                "too, or pass --keep-files")
            if registry_file is not None and registry_file.is_relative_to(d.absolute()):
                raise UserError(f"run {run.id}: {where} holds the registry database; not deleting it")
            plan.dirs.append(d)
            plan.size += tree_size(d)
    return plans


def _aside(path: Path) -> Path:
    return path.with_name(f".{path.name}.deleting-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def remove_with_rows(paths: Sequence[Path], delete_rows: Callable[[], object]) -> list[str]:
    """Rename every path aside, run `delete_rows` (one transaction), then remove the renamed paths; when the
    transaction fails every path is renamed back and the error re-raised as a RecordingError (exit 1). Returns the
    paths that could not be removed afterwards (the rows are gone; the user is told where they are)."""
    moved: list[tuple[Path, Path]] = []
    try:
        for p in paths:
            a = _aside(p)
            os.rename(p, a)
            moved.append((p, a))
    except OSError as e:
        for p, a in reversed(moved):
            os.rename(a, p)
        raise UserError(f"cannot move {printable(str(e.filename or ''), 200)} aside ({e.strerror}); nothing "
                        "deleted") from None
    try:
        delete_rows()
    except BaseException as e:
        for p, a in reversed(moved):
            os.rename(a, p)
        if isinstance(e, (UserError, KeyboardInterrupt, SystemExit)):
            raise
        raise RecordingError(f"the registry could not be written ({printable(str(e), 300)}); nothing deleted, "
                             "every file is back in place") from e
    left = []
    for _, a in moved:
        try:
            shutil.rmtree(a) if a.is_dir() and not a.is_symlink() else a.unlink()
        except OSError:
            left.append(str(a))
    return left


def delete_runs(reg: Registry, plans: Sequence[RunDeletion]) -> list[str]:
    """Delete the planned runs: rows and directories together (see `remove_with_rows`)."""
    ids = [p.run.id for p in plans]
    return remove_with_rows([d for p in plans for d in p.dirs], lambda: reg.delete_runs(ids))


# ── freeing checkpoints ──────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Freed:
    run: RunRow
    path: Path
    size: int
    why: str


def plan_gc(reg: Registry, keep: str, metric: str = "val_loss", where: str | None = None) -> list[Freed]:
    """The recorded checkpoint files of FINISHED runs that `keep` lets go, as they are on this host:

    - `last`: each run keeps its latest recorded checkpoint; older ones (recorded at other paths) go.
    - `best`: among the FINISHED runs of one model (model hash), only the run with the best `metrics.best.<metric>`
      keeps its latest checkpoint; a run without that metric keeps its latest too (it cannot be judged).
    - `none`: every checkpoint of every FINISHED run goes.

    RUNNING (and every other unfinished) run is never touched, nor a file another run's artifact still names, nor
    anything that is not a recorded checkpoint artifact."""
    from archspec.registry.query.fields import higher_is_better

    if keep not in KEEP_POLICIES:
        raise UserError(f"--keep must be one of {', '.join(KEEP_POLICIES)}, got {printable(keep, 40)!r}")
    finished = [r for r in reg.runs(where=where) if r.status == FINISHED]
    artifacts = reg.all_artifacts()
    checkpoints: dict[str, list[str]] = {}
    for run_id, kind, path in artifacts:
        if kind == "checkpoint":
            lst = checkpoints.setdefault(run_id, [])
            if path in lst:
                lst.remove(path)
            lst.append(path)  # recorded order: the last is the latest
    best_of_model: dict[str, str] = {}
    if keep == "best":
        by_model: dict[str, list[RunRow]] = {}
        for r in finished:
            if metric in r.best:
                by_model.setdefault(r.model_hash, []).append(r)
        sign = -1.0 if higher_is_better(metric) else 1.0
        for h, rs in by_model.items():
            best_of_model[h] = min(rs, key=lambda r: (sign * r.best[metric], r.id)).id
    freed: list[tuple[RunRow, str, str]] = []
    for r in finished:
        paths = checkpoints.get(r.id, [])
        if not paths:
            continue
        if keep == "none":
            freed += [(r, p, "--keep none") for p in paths]
        elif keep == "last" or metric not in r.best or best_of_model.get(r.model_hash) == r.id:
            freed += [(r, p, "superseded by a later checkpoint of the run") for p in paths[:-1]]
        else:
            winner = best_of_model[r.model_hash]
            freed += [(r, p, f"run {winner} has the model's best {metric}") for p in paths]
    going = {(r.id, p) for r, p, _ in freed}
    still_named = {p for run_id, _, p in artifacts if (run_id, p) not in going}
    out = []
    for r, p, why in freed:
        path = Path(p)
        if p in still_named or not path.is_absolute() or path.is_symlink() or not path.is_file():
            continue  # another run's (or a kept) artifact, not here, or not a plain file: left alone
        out.append(Freed(r, path, tree_size(path), why))
    return out


def apply_gc(reg: Registry, plan: Sequence[Freed]) -> list[str]:
    """Remove the planned checkpoint files and forget their artifact rows, together."""
    def rows() -> None:
        by_run: dict[str, list[str]] = {}
        for f in plan:
            by_run.setdefault(f.run.id, []).append(str(f.path))
        reg.forget_artifacts(by_run)

    return remove_with_rows([f.path for f in plan], rows)
