"""Fixtures shared by several test files. Keep this small: a fixture belongs here only when several files need it.

Tests never touch the user's state: before any test runs, $ARCHSPEC_HOME, $ARCHSPEC_CACHE and the XDG directories
point into a temporary directory of the session (subprocesses inherit them), and the session fails if the
repository's own state directories or the user's archspec directories changed while it ran."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis: the suite draws the same examples on every run (derandomized), so a run's verdict is the code's, not
# the draw's; ARCHSPEC_HYPOTHESIS=explore draws fresh ones each run, for a longer search by hand (what it finds
# becomes a fix and an explicit case).
settings.register_profile("suite", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
_PROFILE = os.environ.get("ARCHSPEC_HYPOTHESIS", "suite")
if _PROFILE not in ("suite", "explore"):
    raise pytest.UsageError(f"$ARCHSPEC_HYPOTHESIS: expected suite or explore, got {_PROFILE!r}")
settings.load_profile(_PROFILE)

ROOT = Path(__file__).resolve().parents[1]
_REAL_HOME = Path.home()
# What a test could touch by accident: the checkout's default state and the user's per-user archspec directories.
WATCHED = [ROOT / "registry", ROOT / "runs", ROOT / ".cache", ROOT / "generated", ROOT / "builds",
           _REAL_HOME / ".cache" / "archspec", _REAL_HOME / ".local" / "share" / "archspec"]


_SCRATCH = {".hypothesis", ".pytest_cache", ".venv", "__pycache__", "archspec.egg-info", "build", "dist"}


def _snapshot() -> dict[str, str]:
    # The checkout's top level: a test that writes into the working directory (a relative path it was handed) adds an
    # entry here.
    out: dict[str, str] = {f"top-level entry {name!r}": "present" for name in os.listdir(ROOT) if name not in _SCRATCH}
    for top in WATCHED:
        if not top.exists():
            continue
        for path in sorted([top, *top.rglob("*")]):
            if path.is_file():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[str(path)] = "dir"
    return out


_SESSION_STATE = Path(tempfile.mkdtemp(prefix="archspec-test-state-"))
for _name, _sub in (("ARCHSPEC_HOME", "home"), ("ARCHSPEC_CACHE", "cache"), ("XDG_DATA_HOME", "xdg-data"),
                    ("XDG_CACHE_HOME", "xdg-cache")):
    os.environ[_name] = str(_SESSION_STATE / _sub)
os.environ.pop("ARCHSPEC_REGISTRY", None)
# Output width is the pipe's (archspec.console.PIPED_WIDTH) in every test, whoever runs the suite: pytest-xdist's
# workers set COLUMNS=80, a terminal may export its own.
os.environ.pop("COLUMNS", None)


def pytest_sessionstart(session):
    session.config._archspec_state_before = _snapshot()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_archspec_state_before", None)
    if before is None:
        return
    after = _snapshot()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        print(f"\nERROR: the test session changed user or repository state ({len(changed)} paths):\n  "
              + "\n  ".join(changed[:20]))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def gen_dir(tmp_path_factory):
    """A session-wide directory for generated modules. Hypothesis properties cannot use the function-scoped
    `tmp_path` (one directory would serve every example anyway); generated files are named by spec and imported by
    content hash, so sharing one directory is safe."""
    return tmp_path_factory.mktemp("generated")
