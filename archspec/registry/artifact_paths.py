"""Artifact paths that resolve on every host sharing the storage: one function to store a path, one to read it.

Without a declared root, a path is stored absolute, as it always was (the run's `host` says which machine holds it).
With `ARCHSPEC_ARTIFACT_ROOT` (or `--artifact-root`, which sets it) naming a shared filesystem path — each host may
mount it elsewhere (`/mnt/shared` here, `/lustre/lab` on the cluster) — a path under the root is stored relative to
it behind the marker `$ARCHSPEC_ARTIFACT_ROOT/`, and a reader resolves it against its own root. Paths outside the
root stay absolute. A stored relative path read where no root is declared is a UserError naming the variable: the
registry never guesses where another host's storage is mounted here.

Every artifact path the registry writes or reads goes through `stored` and `resolved` (writes.add_artifact,
record_evaluation, forget_artifacts; reads.artifacts, all_artifacts, evaluations); the loop, `runs show`, the UI,
`archspec gc` and `archspec sample RUN` read through those.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from archspec.errors import UserError, printable

ROOT_VAR = "ARCHSPEC_ARTIFACT_ROOT"
MARKER = "$" + ROOT_VAR + "/"


def artifact_root() -> Path | None:
    """This host's declared root ($ARCHSPEC_ARTIFACT_ROOT), absolute and normalised; None when unset."""
    raw = os.environ.get(ROOT_VAR, "")
    if not raw.strip():
        return None
    path = Path(raw)
    if not path.is_absolute():
        raise UserError(f"${ROOT_VAR} must be an absolute path (where this host mounts the shared storage), got "
                        f"{printable(repr(raw), 200)}")
    return Path(os.path.normpath(path))


def stored(path: str | os.PathLike) -> str:
    """The form a path is recorded in: relative to the root behind MARKER when under it, else absolute."""
    text = os.fspath(path)
    if text.startswith(MARKER):
        return text  # already in stored form
    absolute = Path(os.path.abspath(text))
    root = artifact_root()
    if root is not None:
        try:
            rel = absolute.relative_to(root)
        except ValueError:
            return str(absolute)
        return MARKER + rel.as_posix()
    return str(absolute)


def resolved(text: str) -> str:
    """A recorded path as a path on this host: a MARKER path under this host's root; others as recorded."""
    if not text.startswith(MARKER):
        return text
    root = artifact_root()
    rel = PurePosixPath(text[len(MARKER):])
    if root is None:
        raise UserError(f"the artifact {printable(text, 300)} is recorded relative to ${ROOT_VAR}, which this host "
                        f"does not set; export {ROOT_VAR}=<where this host mounts the shared storage> "
                        "(or pass --artifact-root)")
    if rel.is_absolute() or ".." in rel.parts:
        raise UserError(f"the artifact {printable(text, 300)} leaves ${ROOT_VAR}; the record is damaged")
    return str(root.joinpath(*rel.parts))
