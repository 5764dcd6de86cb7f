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

import os
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from archspec.errors import Caution, UserError, printable
from archspec.registry.reads import RunRow
from archspec.registry.store import Registry
from archspec.train.logger import FINISHED, RecordingError

SHARDED_PATTERN = "checkpoint-step*.dcp"
CHECKPOINT = "checkpoint.pt"  # archspec.train.checkpoint.FILENAME: the only name a run's checkpoint has

# What a run directory holds when archspec wrote it (archspec.train: loop, checkpoint, tokenizer, run_dir, codegen),
# besides the run's recorded artifacts. Each entry is judged by its name *and* its type: the files are plain files, the
# directories are walked and must hold only what archspec (Python, DCP) writes there. Anything else is the user's: the
# directory is not deleted.
RUN_FILES = ("checkpoint.pt", "tokenizer.json", "run.json", "metrics.jsonl")
RUN_DIRS = {  # directory name → the names of the plain files it may hold
    "__pycache__": re.compile(r"[\w.-]+\.pyc(\.\d+)?"),  # importlib writes <name>.pyc.<id> and renames it
    SHARDED_PATTERN: re.compile(r"\.metadata(\.tmp)?|__\d+(_\d+\.distcp|\.metadata(\.tmp)?)"),  # DCP's own names
}
_SHARDED = re.compile(r"checkpoint-step\d+\.dcp")
_ASIDE = re.compile(r"\.(checkpoint\.pt|checkpoint-step\d+\.dcp)\.deleting-\d+-[0-9a-f]{8}")  # gc's, left over
KEEP_POLICIES = ("last", "best", "none")


def _temp_of(name: str, files: set[str]) -> bool:
    """A temporary file archspec writes beside one of `files`: `.NAME.<pid>.<hex12>.tmp` (cache.temp_path_beside) or,
    for a generated module NAME.py, `NAME.py.tmp<pid>` (codegen.generate)."""
    m = re.fullmatch(r"\.(.+)\.\d+\.[0-9a-f]{12}\.tmp", name)
    if m and m.group(1) in files:
        return True
    m = re.fullmatch(r"(.+\.py)\.tmp\d+", name)
    return bool(m and m.group(1) in files)


def foreign_entries(d: Path, recorded: set[str]) -> list[str]:
    """The entries of run directory `d` (names relative to it) that archspec did not write: not a recorded artifact or
    a run file (plain files), not an allowed directory holding only its allowed plain files, not a temporary file
    archspec names. OSError when `d` cannot be listed."""
    files = set(recorded) | set(RUN_FILES)
    foreign = []
    with os.scandir(d) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        is_file = e.is_file(follow_symlinks=False)
        is_dir = e.is_dir(follow_symlinks=False)
        if is_file and (e.name in files or _temp_of(e.name, files)):
            continue
        aside = _ASIDE.fullmatch(e.name)
        allowed = RUN_DIRS.get("__pycache__") if e.name == "__pycache__" else (
            RUN_DIRS[SHARDED_PATTERN] if _SHARDED.fullmatch(e.name) or (aside and aside.group(1).endswith(".dcp"))
            else None)
        if is_file and aside and aside.group(1) == "checkpoint.pt":
            continue
        if is_dir and allowed is not None:
            try:
                with os.scandir(e.path) as sub:
                    inside = sorted(sub, key=lambda x: x.name)
            except OSError:
                foreign.append(e.name + "/")
                continue
            foreign += [f"{e.name}/{x.name}" for x in inside
                        if not (x.is_file(follow_symlinks=False) and allowed.fullmatch(x.name))]
            continue
        foreign.append(e.name + ("/" if is_dir else ""))
    return foreign


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


# ── confinement: what archspec may delete ──────────────────────────────────────────────────────────────────────


def confined(path: Path, protected: Sequence[tuple[str, Path]], *, directory: bool) -> tuple[Path | None, str]:
    """(`path` resolved, "") when archspec may delete it, else (None, why) — one helper for `runs delete` (a run
    directory) and `gc` (a checkpoint file in one). The recorded path must be absolute and itself no link (a link
    pointing out is never followed), the right type (a real directory, or a plain file), and, resolved (links and
    `..` of its parents followed), neither be nor hold a protected place (the registry, the working directory, $HOME,
    archspec's state root) nor lie directly in one. The caller acts on the resolved path, and `remove_with_rows`
    checks it again at the moment of acting (`_unchanged`)."""
    if not path.is_absolute():
        return None, "recorded as a relative path"
    if path.is_symlink():
        return None, "is a link (archspec never follows one to delete what it points at)"
    if directory and not path.is_dir():
        return None, "is not a directory"
    if not directory and not path.is_file():
        return None, "is not a plain file"
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as e:
        return None, f"cannot be resolved ({getattr(e, 'strerror', None) or type(e).__name__})"
    home = real if directory else real.parent
    for what, place in protected:
        if place == home or place.is_relative_to(home) or (not directory and place == real):
            return None, f"is or holds {what} ({printable(str(place), 200)})"
    return real, ""


def _unchanged(p: Path) -> bool:
    """At the moment of acting: `p` (a resolved path) is still itself, no link in it or anywhere above it."""
    return not os.path.islink(p) and os.path.realpath(p) == str(p)


# ── deleting runs ────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class RunDeletion:
    """What deleting one run removes: its registry rows, and its run directories (those on this host)."""

    run: RunRow
    dirs: list[Path] = field(default_factory=list)  # archspec's run directories, checked
    missing: list[Path] = field(default_factory=list)  # recorded, but not here (another host, or already gone)
    size: int = 0


def plan_deletion(reg: Registry, runs: Sequence[RunRow], keep_files: bool = False) -> list[RunDeletion]:
    """Check every run's directory and say what deleting the runs removes; UserError (nothing removed) when a
    directory cannot be deleted safely: it holds files archspec did not write, another run's files, or the
    registry itself."""
    ids = {r.id for r in runs}
    all_artifacts = reg.all_artifacts()
    protected = _protected_paths(reg)
    plans = []
    taken: set[Path] = set()  # directories an earlier plan already deletes (two runs sharing one)
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
            real, why = confined(d, protected, directory=True)
            if real is None:
                raise UserError(f"run {run.id}: {where} {why}; not deleting it: archspec deletes only run directories "
                                "it created (--keep-files deletes the registry rows alone)")
            recorded = {Path(p).name for rid, _, p in all_artifacts if rid in ids and Path(p).parent == d}
            if not any((d / name).is_file() for name in recorded):
                raise UserError(f"run {run.id}: {where} holds none of the run's recorded files (its module or "
                                "checkpoint); not deleting a directory archspec cannot tell is the run's "
                                "(--keep-files deletes the registry rows alone)")
            try:
                foreign = foreign_entries(d, recorded)
            except OSError as e:
                raise UserError(f"run {run.id}: cannot list {where}: {e.strerror}") from None
            if foreign:
                shown = ", ".join(printable(f, 60) for f in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
                raise UserError(f"run {run.id}: {where} also holds files archspec did not write ({shown}); delete "
                                "or move them first, or pass --keep-files to delete the registry rows alone")
            others = sorted({rid for rid, _, p in all_artifacts if rid not in ids and Path(p).parent == d})
            if others:
                raise UserError(f"run {run.id}: {where} also holds the files of run {others[0]}"
                                f"{f' (and {len(others) - 1} more)' if len(others) > 1 else ''}; delete those runs "
                                "too, or pass --keep-files")
            if real in taken:
                continue  # another planned run's directory too: deleted (and counted) once
            taken.add(real)
            plan.dirs.append(real)  # acted on as resolved, and checked again then
            plan.size += tree_size(real)
        _plan_tensorboard(plan, taken)
    return plans


TENSORBOARD_FILE = "events.out.tfevents."  # what a SummaryWriter writes, and all the sink's directory holds


def _plan_tensorboard(plan: RunDeletion, taken: set[Path]) -> None:
    """The run's TensorBoard directory (archspec.train.sinks.tensorboard_logdir), when the sink wrote one here:
    deleted with the run, like its run directory, when it holds event files only."""
    from archspec.train.sinks import tensorboard_logdir

    run = plan.run
    d = tensorboard_logdir(run.spec_name or run.name, run.id)
    if d.is_symlink() or not d.is_dir():
        return
    foreign = sorted(e.name for e in d.iterdir() if not (e.is_file() and e.name.startswith(TENSORBOARD_FILE)))
    if foreign:
        raise UserError(f"run {run.id}: {printable(str(d), 200)} also holds files the TensorBoard sink did not write "
                        f"({', '.join(printable(f, 60) for f in foreign[:3])}); move them first, or pass --keep-files")
    real = d.resolve()
    if real not in taken:
        taken.add(real)
        plan.dirs.append(real)  # acted on as resolved, and checked again then (as a run directory is)
        plan.size += tree_size(real)


def _protected_paths(reg: Registry) -> list[tuple[str, Path]]:
    """What a run directory must never be nor contain, resolved (links and `..` followed): the registry database, the
    working directory, $HOME, archspec's state root."""
    from archspec.paths import state_root

    out = []
    registry_file = getattr(reg, "_file", None)
    if registry_file is not None:
        out.append(("the registry database", Path(registry_file).resolve()))
    for what, get in (("the working directory", Path.cwd), ("your home directory", Path.home),
                      ("archspec's state root", lambda: state_root()[0])):
        try:
            out.append((what, Path(get()).resolve()))
        except (OSError, RuntimeError, KeyError):
            pass  # no cwd (deleted), no $HOME: nothing to compare
    return out


def _aside(path: Path) -> Path:
    return path.with_name(f".{path.name}.deleting-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _put_back(moved: Sequence[tuple[Path, Path]]) -> list[str]:
    """Rename every moved path back, each on its own (one failure does not abandon the rest); the ones that could
    not be restored, said as `aside → original`."""
    lost = []
    for p, a in reversed(moved):
        try:
            os.rename(a, p)
        except OSError as e:
            lost.append(f"{printable(str(a), 200)} → {printable(str(p), 200)} ({e.strerror})")
    return lost


def _not_restored(lost: Sequence[str]) -> str:
    return ("; could not be renamed back (rename them by hand): " + "; ".join(lost)) if lost else ""


def _report_interrupted(lost: Sequence[str]) -> None:
    """An interruption is re-raised as it was (its exit code is the shell's); what could not be put back is said first."""
    if lost:
        import sys

        print("interrupted; nothing deleted" + _not_restored(lost), file=sys.stderr)


def remove_with_rows(paths: Sequence[Path], delete_rows: Callable[[], object],
                     done: Callable[[list[str]], None] | None = None) -> list[str]:
    """Rename every path aside, run `delete_rows` (one transaction), then remove the renamed paths; when anything
    fails before the transaction commits (an error, Ctrl-C, SIGTERM) every path is renamed back and the error re-raised
    (a failed transaction as a RecordingError, exit 1; an interruption as it was). The whole is done with interrupts
    deferred (archspec.signals: the CLI's handlers), so a signal is acted on once the deletion is complete. Returns
    the paths that could not be removed afterwards (the rows are gone; the user is told where they are). `done` is
    called with them once everything is removed, still inside the deferred block: a signal that arrived meanwhile is
    raised after it, so the user reads what was done before `interrupted`."""
    from archspec.signals import deferred_interrupts

    with deferred_interrupts():
        moved: list[tuple[Path, Path]] = []
        try:
            for p in paths:
                if not _unchanged(p):
                    raise UserError(f"{printable(str(p), 200)}: changed since it was checked (a link now stands in "
                                    "its path); nothing deleted")
                a = _aside(p)
                os.rename(p, a)
                moved.append((p, a))
        except BaseException as e:
            lost = _put_back(moved)
            if isinstance(e, UserError):
                raise UserError(str(e) + _not_restored(lost)) from None
            if isinstance(e, OSError):
                raise UserError(f"cannot move {printable(str(e.filename or ''), 200)} aside ({e.strerror}); nothing "
                                "deleted" + _not_restored(lost)) from None
            _report_interrupted(lost)
            raise
        try:
            delete_rows()
        except BaseException as e:
            lost = _put_back(moved)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                _report_interrupted(lost)
                raise
            if isinstance(e, UserError) and not lost:
                raise
            raise RecordingError(f"the registry could not be written ({printable(str(e), 300)}); nothing deleted"
                                 + (_not_restored(lost) or ", every file is back in place")) from e
        left = []
        for _, a in moved:
            try:
                shutil.rmtree(a) if a.is_dir() and not a.is_symlink() else a.unlink()
            except OSError:
                left.append(str(a))
        if done is not None:
            done(left)
        return left


def delete_runs(reg: Registry, plans: Sequence[RunDeletion], done: Callable[[list[str]], None] | None = None,
                ) -> list[str]:
    """Delete the planned runs: rows and directories together (see `remove_with_rows`)."""
    ids = [p.run.id for p in plans]
    return remove_with_rows([d for p in plans for d in p.dirs], lambda: reg.delete_runs(ids), done)


# ── freeing checkpoints ──────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Freed:
    run: RunRow
    path: Path
    size: int
    why: str
    shards: Path | None = None  # the sharded directory (checkpoint-stepN.dcp) the checkpoint file commits, freed too


def _sharded_name(path: Path) -> str | None:
    """The sharded directory a checkpoint file names (`checkpoint.sharded_directory` reads the same key); None for a
    whole checkpoint. ValueError when the file cannot be read (safely) or names something that is not a directory
    name beside it."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 (torch raises many types for a bad file)
        raise ValueError(f"not readable ({type(e).__name__})") from None
    name = state.get("sharded") if isinstance(state, dict) else None
    if name is None:
        return None
    if not isinstance(name, str) or not _SHARDED.fullmatch(name):
        raise ValueError(f"its sharded state names {printable(repr(name), 80)}")
    return name


def _free_shards(path: Path) -> tuple[bool, Path | None]:
    """(whether the checkpoint file may go, the sharded directory that goes with it). A directory without any
    `checkpoint-step*.dcp` holds whole checkpoints only; otherwise the file is read for the directory it commits, which
    must be a real directory holding DCP's files only; anything doubtful keeps the checkpoint."""
    try:
        if not any(_SHARDED.fullmatch(n) for n in os.listdir(path.parent)):
            return True, None
        name = _sharded_name(path)
    except (OSError, ValueError):
        return False, None
    if name is None:
        return True, None
    shards = path.parent / name
    if shards.is_symlink() or not shards.is_dir():
        return True, None  # committed directory already gone: the file alone is freed
    try:
        inside = os.listdir(shards)
    except OSError:
        return False, None
    if not all(RUN_DIRS[SHARDED_PATTERN].fullmatch(n) and (shards / n).is_file() and not (shards / n).is_symlink()
               for n in inside):
        return False, None
    return True, shards


def plan_gc(reg: Registry, keep: str, metric: str = "val_loss", where: str | None = None) -> list[Freed]:
    """The recorded checkpoint files of FINISHED runs that `keep` lets go, as they are on this host:

    - `last`: each run keeps its latest recorded checkpoint; older ones (recorded at other paths) go.
    - `best`: among the FINISHED runs of one model on one data set (model hash and data hash: a val_loss on other
      data is not comparable; runs that differ only in their recipe, lr or steps, are exactly what `best` chooses
      among), only the run with the best `metrics.best.<metric>` keeps its latest checkpoint; a run without that
      metric keeps its latest too (it cannot be judged).
    - `none`: every checkpoint of every FINISHED run goes.

    RUNNING (and every other unfinished) run is never touched, nor any file in a directory that holds a recorded file
    of a run that is not FINISHED (a resumed run B writes into A's directory and records its checkpoint only when it
    finishes), nor a file another run's artifact still names, nor anything that is not a recorded checkpoint
    artifact. A sharded checkpoint (FSDP) is its checkpoint.pt, the commit file, and the `checkpoint-stepN.dcp/`
    directory it names: both are freed together."""
    from archspec.registry.query.fields import higher_is_better

    if keep not in KEEP_POLICIES:
        raise UserError(f"--keep must be one of {', '.join(KEEP_POLICIES)}, got {printable(keep, 40)!r}")
    everyone = reg.runs()
    status = {r.id: r.status for r in everyone}
    chosen = {r.id for r in reg.runs(where=where)} if where else set(status)
    finished = [r for r in everyone if r.status == FINISHED and r.id in chosen]
    artifacts = reg.all_artifacts()
    busy: set[Path] = set()  # directories a run that is not FINISHED uses (RUNNING, KILLED and resumable, ...)
    for run_id, _, path in artifacts:
        if status.get(run_id) != FINISHED:
            busy |= {Path(path).parent, Path(os.path.realpath(path)).parent}
    checkpoints: dict[str, list[str]] = {}
    for run_id, kind, path in artifacts:
        if kind == "checkpoint":
            lst = checkpoints.setdefault(run_id, [])
            if path in lst:
                lst.remove(path)
            lst.append(path)  # recorded order: the last is the latest
    best_of: dict[tuple[str, str], str] = {}

    def group(r: RunRow) -> tuple[str, str]:
        return r.model_hash, r.data_hash

    if keep == "best":
        groups: dict[tuple[str, str], list[RunRow]] = {}
        for r in finished:
            if metric in r.best:
                groups.setdefault(group(r), []).append(r)
        sign = -1.0 if higher_is_better(metric) else 1.0
        for g, rs in groups.items():
            best_of[g] = min(rs, key=lambda r: (sign * r.best[metric], r.id)).id
    freed: list[tuple[RunRow, str, str]] = []
    for r in finished:
        paths = checkpoints.get(r.id, [])
        if not paths:
            continue
        if keep == "none":
            freed += [(r, p, "--keep none") for p in paths]
        elif keep == "last" or metric not in r.best or best_of.get(group(r)) == r.id:
            freed += [(r, p, "superseded by a later checkpoint of the run") for p in paths[:-1]]
        else:
            winner = best_of[group(r)]
            freed += [(r, p, f"run {winner} has the best {metric} of its model and data") for p in paths]
    going = {(r.id, p) for r, p, _ in freed}
    still_named = {p for run_id, _, p in artifacts if (run_id, p) not in going}
    protected = _protected_paths(reg)
    run_dirs = {Path(os.path.realpath(p)).parent for _, kind, p in artifacts if kind == "model" and Path(p).is_absolute()}
    out = []
    for r, p, why in freed:
        path = Path(p)
        if p in still_named or not path.is_absolute() or not (path.exists() or path.is_symlink()):
            continue  # another run's (or a kept) artifact, or not here (another host, already gone): left alone
        real, problem = confined(path, protected, directory=False)
        if real is not None and real.name != CHECKPOINT:
            real, problem = None, f"is not named {CHECKPOINT}, the name archspec gives a checkpoint"
        if real is not None and real.parent not in run_dirs:
            real, problem = None, "lies outside every run directory (none holds a run's recorded module there)"
        if real is None:
            warnings.warn(Caution(f"gc: run {r.id}: {printable(p, 200)} {problem}; left alone"))
            continue
        path = real  # acted on as resolved, and checked again then
        if path.parent in busy or Path(os.path.realpath(path)).parent in busy:
            continue  # a run that is not FINISHED uses the directory (it may be writing this very file)
        ok, shards = _free_shards(path)
        if not ok:
            continue
        out.append(Freed(r, path, tree_size(path) + (tree_size(shards) if shards else 0), why, shards))
    return out


def apply_gc(reg: Registry, plan: Sequence[Freed], done: Callable[[list[str]], None] | None = None) -> list[str]:
    """Remove the planned checkpoint files (with their sharded directories) and forget their artifact rows,
    together. Nothing planned: nothing written (the registry is not even opened for writing)."""
    if not plan:
        return []

    def rows() -> None:
        by_run: dict[str, list[str]] = {}
        for f in plan:
            by_run.setdefault(f.run.id, []).append(str(f.path))
        reg.forget_artifacts(by_run)

    return remove_with_rows([q for f in plan for q in (f.path, f.shards) if q is not None], rows, done)
