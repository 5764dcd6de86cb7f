"""The wheel ships everything the package reads at run time: every template (in every kind's folder) and every
migration. A wheel that lacked `norm/layernorm.py.j2` installed fine and then could not build anything.

The full round trip (install the wheel into a fresh venv, `archspec build`, a 5-step `train` from outside the
repository) is in .ci/run: it needs a fresh venv with torch, too slow for the unit suite."""

from __future__ import annotations

import ast
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


# ── production code runs without the test extra ─────────────────────────────────────────────────────────────────

_PRODUCTION = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "testing"]


def _imports(tree: ast.AST, *, at_import_time: bool = False):
    """(name, line) of every module an import statement names; with `at_import_time`, only those run when the
    module is imported (not inside a function, not under `if TYPE_CHECKING:`)."""
    for node in ast.iter_child_nodes(tree):
        if at_import_time and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if at_import_time and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (i for child in node.orelse for i in _imports(child, at_import_time=True))
            continue
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield (node.module or "", node.lineno)
            yield from ((f"{node.module}.{a.name}", node.lineno) for a in node.names)
        yield from _imports(node, at_import_time=at_import_time)


@pytest.mark.parametrize("path", _PRODUCTION, ids=lambda p: str(p.relative_to(ROOT)))
def test_production_code_imports_neither_archspec_testing_nor_hypothesis(path):
    """archspec.testing and hypothesis are for tests: no production module imports the one, and the other only
    inside the hooks that draw a kind (`KindUnit.strategy`, `invalid_cases`), which tests alone call."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = [f"line {line}: {name}" for name, line in _imports(tree)
           if name == "archspec.testing" or name.startswith("archspec.testing.")]
    bad += [f"line {line}: {name} (at import time)" for name, line in _imports(tree, at_import_time=True)
            if name.split(".")[0] == "hypothesis"]
    assert not bad, f"{path.relative_to(ROOT)} imports test code: {bad}"


def test_the_package_imports_without_hypothesis():
    child = ("import sys; sys.modules['hypothesis'] = None\n"  # any `import hypothesis` now fails
             "import archspec, archspec.kinds, archspec.spec, archspec.codegen, archspec.accounting, archspec.cli\n"
             "from archspec.spec import load_spec_dict\n"
             "load_spec_dict({'name': 'x', 'model': {'vocab_size': 8, 'context_length': 4, 'd_model': 8, "
             "'n_layers': 1, 'attention': {'n_heads': 2}}})\n"
             "print('OK')")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr[-3000:]
