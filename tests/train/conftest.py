"""Shared fixtures for the training-loop tests: a small corpus, a session-wide cache, and a tiny spec."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from archspec.spec import load_spec_dict

# Real text, small and the same on every machine with this Python: a handful of stdlib modules.
CORPUS_MODULES = ["bisect.py", "colorsys.py", "copy.py", "fnmatch.py", "heapq.py", "keyword.py", "numbers.py",
                  "opcode.py", "queue.py", "sched.py", "shlex.py", "stat.py", "string.py", "textwrap.py",
                  "this.py", "token.py", "tty.py", "types.py", "uu.py", "weakref.py"]


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = tmp_path_factory.mktemp("corpus")
    for name in CORPUS_MODULES:
        src = root / name
        if src.exists():
            (out / name.replace(".py", ".txt")).write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    """One derived-data cache for the session: the corpus is tokenised and the CPU peak measured once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _isolated_env(cache, tmp_path, monkeypatch):
    """The session cache, and a registry of the test's own (the CLI records runs there by default)."""
    monkeypatch.setenv("ARCHSPEC_CACHE", str(cache))
    monkeypatch.setenv("ARCHSPEC_REGISTRY", f"sqlite:///{tmp_path}/registry.db")


def tiny_spec_dict(corpus_dir: Path, **train) -> dict:
    recipe = {
        "seed": 0, "steps": 8, "batch_size": 4, "seq_len": 32, "lr": 3e-3, "warmup_steps": 2,
        "eval_interval": 4, "eval_tokens": 256, "compile": "none",
        "data": {"corpus": {"kind": "files", "paths": [str(corpus_dir)]}, "val_fraction": 0.1},
    }
    recipe.update(train)
    return {
        "name": "tiny",
        "model": {"vocab_size": 320, "context_length": 32, "d_model": 32, "n_layers": 2,
                  "attention": {"n_heads": 2, "n_kv_heads": 1}, "ffn": {"kind": "glu", "hidden_dim": 64}},
        "train": recipe,
    }


@pytest.fixture
def make_spec(corpus_dir):
    """make_spec(steps=4, ...) → a validated tiny spec; `model=` merges into the model section."""
    def make(model: dict | None = None, **train):
        data = tiny_spec_dict(corpus_dir, **train)
        data["model"].update(model or {})
        return load_spec_dict(data)
    return make
