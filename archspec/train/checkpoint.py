"""Checkpoints: everything needed to continue a run exactly, written atomically, read without unpickling code.

A checkpoint holds the model and optimizer state, the step (the schedule is a pure function of it), the RNG states
(python, torch, every CUDA device) and the data position. The sampler draws its order from (seed, epoch) with its
own generator, so numpy's global RNG is never used and not saved. The file is written to a temporary name beside the
target, flushed to disk and renamed over it: a crash leaves the previous checkpoint intact, never a torn one. Loading
uses `torch.load(weights_only=True)`, and every way a file can be wrong ends in a UserError naming the file.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch
from torch import nn

from archspec.errors import UserError
from archspec.train.cache import temp_path_beside

FORMAT = "archspec-checkpoint/1"
FILENAME = "checkpoint.pt"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomically write `state` (plus the format tag) to `path`."""
    tmp = temp_path_beside(path)
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def resolve(path: str | os.PathLike) -> Path:
    """A checkpoint file, or a run directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint file")
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint on the CPU. Raises UserError for a missing, truncated, foreign or unsafe file."""
    path = resolve(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file: RuntimeError, UnpicklingError, EOFError, ...
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        if "weights_only" in first_line:  # torch's advice (weights_only=False) would run the file's pickled code
            first_line = "it holds objects beyond tensors and plain data, which a safe load refuses"
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: {first_line})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"{path}: not an archspec checkpoint (expected format {FORMAT!r})")
    missing = [k for k in ("spec_hash", "spec", "step", "model", "optimizer", "rng", "data") if k not in state]
    if missing:
        raise UserError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    return state


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def check_same_spec(path: Path, state: dict[str, Any], spec_hash: str, spec_json: dict) -> None:
    """A checkpoint continues only the run it came from: same model and same recipe."""
    if state["spec_hash"] == spec_hash:
        return
    saved, now = _flatten(state["spec"]), _flatten(spec_json)
    diffs = [f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}"
             for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    raise UserError(f"{path}: checkpoint was saved for a different spec; resume with the spec it was trained with",
                    diffs[:20] or ["(spec hashes differ)"])


def restore_modules(path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, TypeError) as e:
        raise UserError(f"{path}: model weights do not fit this model", str(e).strip().splitlines()[:10]) from None
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, RuntimeError, KeyError, TypeError) as e:
        raise UserError(f"{path}: optimizer state does not fit this model: {e}") from None
