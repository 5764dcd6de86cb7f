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


def _requirement_bounds(extra: str) -> dict[str, str]:
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {Requirement(r).name: str(Requirement(r).specifier) for r in extras[extra]}


def test_the_test_extra_bounds_every_fast_moving_dependency_above():
    """CI installs fresh: a release that renames what a test uses must not turn main red. Every test dependency but
    the build tool has an upper bound (raised after a green run on the newer release)."""
    unbounded = [name for name, spec in _requirement_bounds("test").items()
                 if name != "setuptools" and not any(op in spec for op in ("<", "~=", "=="))]
    assert not unbounded, f"test extra without an upper bound: {unbounded}"


def test_tests_never_import_another_librarys_private_names():
    """A private helper (a leading underscore) of transformers, ray, hypothesis... moves without notice (transformers
    5.25 renamed yarn_get_mscale). torch is the one exception: the project pins it itself (>=2.13,<2.15), and its
    compile counters and pipeline schedule order, which tests compare against, have no public spelling."""
    import ast

    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules, names = [node.module], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names], []
            else:
                continue
            for module in modules:
                root = module.split(".")[0]
                if root in ("archspec", "tests", "__future__", "_pytest", "torch"):
                    continue
                private = [p for p in module.split(".")[1:] if p.startswith("_")]
                private += [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module} {private}")
    assert not bad, bad
