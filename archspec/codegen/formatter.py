"""The one formatter every generated file goes through: ruff's, at a pinned version and fixed settings.

The templates lay a file out; the formatter makes every file read alike (one line width, one quote style, argument
lists wrapped one way), whatever the kinds a spec combines. Its settings are fixed here and its configuration
discovery is off (`--isolated`), so a `pyproject.toml` or `ruff.toml` in the user's working directory cannot change a
generated file: the same spec gives the same bytes on every machine, which the generated file's hash relies on.
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess

from archspec.errors import UserError

RUFF_VERSION = "0.17.5"  # pinned in pyproject.toml: another version may lay a file out otherwise
LINE_LENGTH = 120
ARGS = ("format", "--isolated", "--line-length", str(LINE_LENGTH), "--target-version", "py311",
        "--stdin-filename", "generated.py", "-")


@functools.cache
def _ruff() -> str:
    try:
        version = importlib.metadata.version("ruff")
        import ruff
        binary = ruff.find_ruff_bin()
    except (importlib.metadata.PackageNotFoundError, ImportError, FileNotFoundError):
        raise UserError(f"generated files are formatted with ruff {RUFF_VERSION}, which is not installed here: "
                        f"pip install ruff=={RUFF_VERSION}") from None
    if version != RUFF_VERSION:
        raise UserError(f"generated files are formatted with ruff {RUFF_VERSION} (pinned, so that a spec gives the "
                        f"same file everywhere); this environment has ruff {version}: pip install ruff=={RUFF_VERSION}")
    return str(binary)


@functools.lru_cache(maxsize=512)
def format_source(text: str) -> str:
    """`text` as ruff formats it. Rendered text that is not valid Python is a bug in a template, not the user's."""
    done = subprocess.run([_ruff(), *ARGS], input=text.encode("utf-8"), capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ruff could not format a rendered file (a template bug): "
                           f"{done.stderr.decode('utf-8', 'replace').strip()}")
    return done.stdout.decode("utf-8")
