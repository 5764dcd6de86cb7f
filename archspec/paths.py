"""Where archspec keeps its state: the one place that decides it.

State (the default registry, the default run directories, builds with `--set`) lives under a *state root*:

1. `$ARCHSPEC_HOME`, when set;
2. else the *project root*: the nearest directory, from the working directory upwards, that holds a `specs/`
   directory or a `pyproject.toml` with a `[tool.archspec]` table (a checkout of archspec, or a user's project);
3. else the per-user data directory, `$XDG_DATA_HOME/archspec` (default `~/.local/share/archspec`).

So a command run from a subdirectory of a project finds that project's registry, and one run from anywhere else uses
one per-user registry instead of creating `./registry/` and `./runs/` wherever it was started. The first time a
command creates state under a root it says where (a `note:` line), once.

Caches are derived data, per user and shared by every project: `$ARCHSPEC_CACHE`, else `$XDG_CACHE_HOME/archspec`
(default `~/.cache/archspec`). Measured machine facts (the CPU's matmul ceiling for MFU) are kept there too: they
belong to the machine, not to a directory.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from archspec.errors import Note, UserError, printable

HOME_ENV = "ARCHSPEC_HOME"
CACHE_ENV = "ARCHSPEC_CACHE"
REGISTRY_FILE = Path("registry") / "archspec.db"
RUNS = "runs"
BUILDS = "builds"


def _utf8(name: str, value: str) -> str:
    """A path read from the environment: it ends up in the registry, so it must be UTF-8 (bytes that are not arrive
    as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"${name}: {printable(value, 80)} is not UTF-8 text; archspec stores the paths it derives "
                        "from it as UTF-8") from None
    return value


def _user_dir(env: str, default: str) -> Path:
    base = _utf8(env, os.environ.get(env) or "") or None
    _utf8("HOME", os.environ.get("HOME") or "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / default
    return root / "archspec"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    if "\0" in value:
        raise UserError(f"${name}: holds a NUL byte; expected a directory path")
    try:
        return Path(_utf8(name, value)).expanduser().absolute()
    except RuntimeError as e:  # ~nosuchuser
        raise UserError(f"${name}: {printable(value, 80)}: {e}") from None


def _declares_archspec(pyproject: Path) -> bool:
    try:
        if pyproject.stat().st_size > 1 << 20:
            return False
        text = pyproject.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(line.strip().startswith("[tool.archspec") for line in text.splitlines())


def project_root(start: Path | None = None) -> Path | None:
    """The nearest directory from `start` (the working directory) upwards holding `specs/` or a pyproject.toml with a
    `[tool.archspec]` table; None when there is none."""
    try:
        here = (start or Path.cwd()).absolute()
    except OSError:  # the working directory was deleted
        return None
    for directory in (here, *here.parents):
        try:
            if (directory / "specs").is_dir() or _declares_archspec(directory / "pyproject.toml"):
                return directory
        except OSError:
            continue
    return None


def state_root() -> tuple[Path, str]:
    """(the state root, why it is that one): see the module docstring."""
    home = _env_path(HOME_ENV)
    if home is not None:
        return home, f"${HOME_ENV}"
    project = project_root()
    if project is not None:
        return project, "the project root: the nearest directory with specs/"
    return _user_dir("XDG_DATA_HOME", ".local/share"), "the per-user data directory (no project root here)"


def default_registry_url() -> str:
    """`sqlite:///<state root>/registry/archspec.db`, an absolute path (the same registry from any subdirectory)."""
    root, _ = state_root()
    return f"sqlite:///{root / REGISTRY_FILE}"


def runs_dir() -> Path:
    """Where run directories go unless `--run-dir` says: `<state root>/runs`."""
    return state_root()[0] / RUNS


def builds_dir() -> Path:
    """Where `archspec build --set ...` writes a module that no spec file describes: `<state root>/builds`."""
    return state_root()[0] / BUILDS


def user_cache_dir() -> Path:
    """`$ARCHSPEC_CACHE`, else `$XDG_CACHE_HOME/archspec`, else `~/.cache/archspec` (not created here)."""
    return _env_path(CACHE_ENV) or _user_dir("XDG_CACHE_HOME", ".cache")


_ANNOUNCED: set[str] = set()


def announce(path: Path) -> None:
    """Say once per process, when archspec is about to create `path` under the state root, where state goes."""
    root, why = state_root()
    try:
        path.absolute().relative_to(root)
    except ValueError:
        return  # an explicit location (--registry, --run-dir): the user chose it
    if path.exists() or str(root) in _ANNOUNCED:
        return
    _ANNOUNCED.add(str(root))
    warnings.warn(Note(f"archspec keeps its registry and runs under {root} ({why}); set ${HOME_ENV} to choose "
                       "another place"), stacklevel=2)


def new_output(path: str | os.PathLike, what: str, *, replace: bool = False) -> Path:
    """Where archspec writes an output the user named (import-hf's spec and checkpoint, export-hf's directory, a
    quantized checkpoint): the path with its directory resolved (links above it followed once, here), so the write
    lands where this check looked, and the writer's own temporary file and rename stay in that one directory. Refused
    (UserError, one line) when the path itself is a link, dangling or not (archspec never writes through one), or
    exists and `replace` is false (nothing is overwritten). Called when the command starts and again just before the
    write (the moment of acting)."""
    p = Path(path)
    shown = printable(str(p), 200)
    if p.is_symlink():
        raise UserError(f"{shown}: is a link; archspec does not write through one (name a new path)")
    if not replace and p.exists():
        raise UserError(f"{shown}: already exists; choose another {what} path (nothing is overwritten)")
    try:
        parent = (p.parent if str(p.parent) else Path(".")).resolve()
    except (OSError, RuntimeError) as e:
        raise UserError(f"{shown}: its directory cannot be resolved ({getattr(e, 'strerror', None) or e})") from None
    return parent / p.name
