"""Fixtures for sweep tests: a small real-text corpus, a session cache, and a tiny base spec that trains in ~1 s."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

MODULES = ["bisect.py", "colorsys.py", "copy.py", "fnmatch.py", "heapq.py", "keyword.py", "numbers.py", "queue.py",
           "sched.py", "shlex.py", "stat.py", "string.py", "textwrap.py"]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    root, out = Path(sysconfig.get_paths()["stdlib"]), tmp_path_factory.mktemp("ablate-corpus")
    for name in MODULES:
        (out / name.replace(".py", ".txt")).write_text((root / name).read_text(encoding="utf-8"), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ablate-cache")


@pytest.fixture
def workdir(tmp_path, monkeypatch, session_cache) -> Path:
    """Run in a fresh directory (runs/ and reports/ land there) with the shared data cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARCHSPEC_CACHE", str(session_cache))
    return tmp_path


@pytest.fixture
def base_spec(corpus) -> dict:
    return {
        "name": "base",
        "model": {"vocab_size": 300, "context_length": 16, "d_model": 32, "n_layers": 1,
                  "attention": {"n_heads": 2}, "ffn": {"kind": "glu", "hidden_dim": 64}},
        "train": {"batch_size": 2, "seq_len": 16, "lr": 3e-3, "warmup_steps": 1, "eval_interval": 2,
                  "eval_tokens": 64, "compile": "none",
                  "data": {"corpus": {"kind": "files", "paths": [str(corpus)]}, "val_fraction": 0.1}},
    }
