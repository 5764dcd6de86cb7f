"""The wheel ships everything the package reads at run time: every template (in every kind's folder) and every
migration. A wheel that lacked `norm/layernorm.py.j2` installed fine and then could not build anything.

The full round trip (install the wheel into a fresh venv, `archspec build`, a 5-step `train` from outside the
repository) is in .ci/run: it needs a fresh venv with torch, too slow for the unit suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "archspec"
# Files the package reads at run time by path rather than by import.


def _package_files() -> set[str]:
    out = set()
    for p in PACKAGE.rglob("*"):
        # every file of the package, whatever its suffix (a README beside a module is documentation users read)
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            out.add(p.relative_to(ROOT).as_posix())
    return out


def test_wheel_holds_every_template_and_migration(tmp_path):
    pytest.importorskip("setuptools")  # in the `test` extra; --no-build-isolation keeps this offline
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(PACKAGE, src / "archspec", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("archspec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    expected = _package_files()
    # The test would be empty if the tree moved: pin what it must at least cover.
    assert any(n.startswith("archspec/kinds/norm/") and n.endswith(".j2") for n in expected)
    assert "archspec/codegen/templates/model.py.j2" in expected
    assert any(n.startswith("archspec/registry/migrations/versions/") for n in expected)
    missing = sorted(expected - names)
    assert not missing, f"files of the package missing from the wheel: {missing}"
