"""The repository itself: no half-resolved merge left in any tracked text file."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_merge_conflict_markers_are_committed():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:  # not a git checkout (a source tarball): nothing to check
        return
    bad = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".j2", ".yaml", ".toml", ".txt", ""} or not path.is_file():
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "=======":
                bad.append(f"{name}:{i}")
    assert not bad, bad
