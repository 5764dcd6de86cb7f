"""Files of a transformers model directory: config.json, safetensors weights (one file or shards with an index),
tokenizer files. Read with limits and no code execution (JSON and safetensors only; pickled .bin weights are
refused); written into a fresh directory that appears whole or not at all."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from archspec.console import NULL_TRACKER, Tracker, byte_size
from archspec.errors import UserError, printable

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
GENERATION = "generation_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MAX_JSON_BYTES = 64 << 20  # a config is kilobytes; a tokenizer.json of a 256k vocabulary is tens of MB


def _regular(path: Path, what: str) -> Path:
    if not path.is_file():
        if path.exists():
            raise UserError(f"{printable(path)}: not a regular file; expected {what}")
        raise UserError(f"{printable(path)}: no such file ({what})")
    return path


def read_json(path: Path, what: str) -> Any:
    _regular(path, what)
    if path.stat().st_size > MAX_JSON_BYTES:
        raise UserError(f"{printable(path)}: larger than {MAX_JSON_BYTES >> 20} MiB; not {what}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UserError(f"{printable(path)}: not valid JSON ({printable(str(e), 160)})") from None


def config_path(path: str | os.PathLike) -> Path:
    """PATH is a config.json or a directory holding one."""
    p = Path(path)
    return p / CONFIG if p.is_dir() else p


def read_tensors(directory: Path, tracker: Tracker = NULL_TRACKER) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards model.safetensors.index.json lists. `tracker`
    (archspec.console.Tracker) advances by one a tensor read, its description naming the shard."""
    from safetensors import SafetensorError, safe_open

    index = directory / INDEX
    if index.exists():
        data = read_json(index, "a safetensors index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise UserError(f"{printable(index)}: weight_map: expected a mapping of tensor names to shard files")
        shards = sorted(set(weight_map.values()))
        for shard in shards:  # shard names are files beside the index: no path may lead elsewhere
            if Path(shard).name != shard or shard in ("", ".", ".."):
                raise UserError(f"{printable(index)}: weight_map: {printable(repr(shard), 80)} is not a file name")
    elif (directory / WEIGHTS).exists():
        weight_map, shards = None, [WEIGHTS]
    else:
        bins = sorted(p.name for p in directory.glob("*.bin"))
        hint = f" ({', '.join(bins[:3])} are pickled PyTorch files, which archspec does not load)" if bins else ""
        raise UserError(f"{printable(directory)}: no {WEIGHTS} or {INDEX}{hint}")
    tensors: dict[str, torch.Tensor] = {}
    tracker.update(total=len(weight_map) if weight_map is not None else None)
    for i, shard in enumerate(shards, 1):
        path = _regular(directory / shard, "a safetensors shard")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                names = f.keys()
                if weight_map is None:
                    tracker.update(total=len(names))
                which = f"shard {i} of {len(shards)}, " if len(shards) > 1 else ""
                tracker.update(f"reading {printable(shard, 60)} ({which}{byte_size(path.stat().st_size)})")
                for name in names:
                    if name in tensors:
                        raise UserError(f"{printable(path)}: tensor {printable(name, 120)} also in another shard")
                    if weight_map is not None and weight_map.get(name) != shard:
                        raise UserError(f"{printable(path)}: tensor {printable(name, 120)} is not listed for this "
                                        f"shard in {INDEX}")
                    tensors[name] = f.get_tensor(name)
                    tracker.update(advance=1)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise UserError(f"{printable(path)}: not a readable safetensors file ({printable(str(e), 160)})") from None
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise UserError(f"{printable(index)}: {len(absent)} listed tensors are in no shard",
                            [printable(n, 120) for n in absent[:10]])
    return tensors


def read_tokenizer(directory: Path) -> dict[str, str]:
    """The tokenizer files present beside the config (tokenizer.json must load), by file name."""
    out: dict[str, str] = {}
    for name in TOKENIZER_FILES:
        path = directory / name
        if path.exists():
            read_json(path, "a tokenizer file")  # valid JSON, within limits
            out[name] = path.read_text(encoding="utf-8")
    if "tokenizer.json" in out:
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_str(out["tokenizer.json"])
        except Exception as e:  # tokenizers raises its own Exception type for a bad file
            raise UserError(f"{printable(directory / 'tokenizer.json')}: not a tokenizer "
                            f"({printable(str(e), 160)})") from None
    else:
        out.clear()  # companions without the tokenizer itself describe nothing archspec can use
    return out


def readable_like_normal_files(directory: Path) -> None:
    """The modes a plain `mkdir` and `open(..., "w")` would have given `directory` and the files in it (0755 and 0644
    under the usual umask 022): what a private temporary directory (mkdtemp: 0700) is given before it is renamed into
    place, so an export is readable like any other model directory, as the user's umask allows."""
    mask = os.umask(0)
    os.umask(mask)
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)
        elif path.is_dir() and not path.is_symlink():
            path.chmod(0o777 & ~mask)
    directory.chmod(0o777 & ~mask)


def write_model_dir(out_dir: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                    tokenizer: dict[str, str], generation: dict[str, Any] | None = None,
                    tracker: Tracker = NULL_TRACKER) -> None:
    """config.json, model.safetensors, the tokenizer files and generation_config.json (when `generation` is given),
    into `out_dir`, which must not exist or be empty.
    Written into a temporary directory beside it and renamed: the directory appears complete or not at all.
    `tracker` (archspec.console.Tracker) advances by one a tensor made ready to write, then names the write."""
    from safetensors.torch import save_file

    from archspec.paths import new_output

    if out_dir.is_symlink() or (out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir()))):
        raise UserError(f"{printable(out_dir)}: exists and is not an empty directory; choose a new one "
                        "(nothing is overwritten, nothing is written through a link)")
    out_dir = new_output(out_dir, "model directory", replace=True)  # its parent resolved: written where checked
    parent = out_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=parent))
    except OSError as e:
        raise UserError(f"{printable(out_dir)}: cannot create it: {e.strerror or e}") from None
    try:
        (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        ready = {}
        for k, v in tensors.items():
            ready[k] = v.contiguous()
            tracker.update(advance=1)
        size = sum(v.numel() * v.element_size() for v in ready.values())
        tracker.update(f"writing {WEIGHTS} ({len(ready):,} tensors, {byte_size(size)})")
        save_file(ready, str(tmp / WEIGHTS), metadata={"format": "pt"})
        if generation is not None:
            (tmp / GENERATION).write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        for name, text in tokenizer.items():
            if name in TOKENIZER_FILES:
                (tmp / name).write_text(text, encoding="utf-8")
        readable_like_normal_files(tmp)  # mkdtemp made it 0700: an export is shared like any model directory
        if out_dir.is_symlink():  # put there since the check: never written through
            raise UserError(f"{printable(out_dir)}: became a link while the model was written; nothing written")
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        os.replace(tmp, out_dir)
    except OSError as e:
        raise UserError(f"{printable(out_dir)}: cannot write it: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
