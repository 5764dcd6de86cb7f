"""Where derived files live (tokenizers, token files, the measured CPU peak) and how they are written.

Everything under the cache is derived from content and named by its hash, so a stale entry is never read: a changed
corpus or tokenizer gets a new name. Writes go to a temporary name first and are renamed into place, so a reader
never sees half a file, and two processes racing to fill the same entry both end with a complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from archspec.errors import UserError

def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """`override`, else the per-user cache (`$ARCHSPEC_CACHE`, else `$XDG_CACHE_HOME/archspec`, else
    `~/.cache/archspec`: archspec.paths); created if missing. A cache that cannot be created or written (read-only,
    under a file, a full disk) is a UserError naming it, before any work is done."""
    from archspec.paths import user_cache_dir

    from_env = override is None and bool(os.environ.get("ARCHSPEC_CACHE"))
    path = Path(override) if override else user_cache_dir()
    where = f"$ARCHSPEC_CACHE={path}" if from_env else f"cache directory {path}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{where}: exists and is not a directory") from None
    except NotADirectoryError:
        raise UserError(f"{where}: a part of the path is a file, not a directory") from None
    except OSError as e:
        raise UserError(f"{where}: cannot create it: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{where}: not writable; set $ARCHSPEC_CACHE to a writable directory")
    return path


@contextmanager
def writing_cache(cache: Path) -> Iterator[None]:
    """Turn a failed write under the cache (a full disk, permissions changed under us) into a UserError naming it."""
    try:
        yield
    except OSError as e:
        raise UserError(f"cache {cache}: cannot write ({e.strerror or e}); free some space or set $ARCHSPEC_CACHE "
                        "to another directory") from None


def digest(*parts: Any) -> str:
    """sha256 of the canonical JSON of `parts`: a cache key from a few identifying values."""
    payload = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def temp_path_beside(path: Path) -> Path:
    """A unique file name in `path`'s directory (same file system, so os.replace is atomic). Not created here, so
    the file gets the usual permissions (mkstemp would make it private)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


def atomic_write_text(path: Path, text: str) -> None:
    tmp = temp_path_beside(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
