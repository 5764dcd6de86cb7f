"""Checkpoints: everything needed to continue a run exactly, written atomically, read without unpickling code.

A checkpoint holds the model and optimizer state, the step (the schedule is a pure function of it), the RNG states
(python, torch, every CUDA device), the data position and the tokenizer (so `archspec sample` needs nothing else). The sampler draws its order from (seed, epoch) with its
own generator, so numpy's global RNG is never used and not saved. The file is written to a temporary name beside the
target, flushed to disk and renamed over it: a crash leaves the previous checkpoint intact, never a torn one. Loading
uses `torch.load(weights_only=True)`, and every way a file can be wrong ends in a UserError naming the file.

Integrity: the file stores a sha256 digest of its content (every tensor's bytes, dtype and shape, every other value),
computed at save time and checked at load time, so flipped bits that still unpickle are refused instead of resuming
from corrupted weights or optimizer state. Then every field is checked for type and shape (step, RNG states, data
position) before any of it is used. Files of the first format (no digest) are still read, without that check.
A write that fails (a full disk, a read-only directory) raises CheckpointWriteError naming the file and the space
left on its disk; the previous checkpoint is untouched and no temporary file is left behind.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pickle
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from archspec.errors import Caution, UserError, printable
from archspec.cache import temp_path_beside
from archspec.train.tokenizer import tokenizer_state_problems

FORMAT = "archspec-checkpoint/2"  # /2: with a content digest
LEGACY_FORMATS = ("archspec-checkpoint/1",)  # read without a digest to verify, only in the exact shape /1 wrote
# What archspec-checkpoint/1 wrote, exactly (archspec 674fb86..1fadff8): a file that claims /1 but holds anything
# else (a digest deleted from a /2 file, a tokenizer, a sharded directory) is not an old checkpoint but an edited one.
LEGACY_V1_KEYS = frozenset({"format", "spec_hash", "spec", "step", "model", "optimizer", "rng", "data", "world_size"})
LEGACY_V1_DATA_KEYS = frozenset({"epoch", "cursor", "seed", "seq_len", "n_windows"})
LEGACY_V1_RNG_KEYS = frozenset({"python", "torch", "cuda"})
FILENAME = "checkpoint.pt"
REQUIRED = ("spec_hash", "spec", "step", "model", "optimizer", "rng", "data")
WEIGHTS_FORMAT = "archspec-weights/1"  # a weights checkpoint: the model alone (import-hf, export-hf, sample)
WEIGHTS_REQUIRED = ("spec_hash", "spec", "model", "tokenizer")
# A quantized checkpoint (`archspec quantize`, archspec.quant): int8/int4 weights, read by `archspec sample` alone.
QUANTIZED_FORMAT = "archspec-quantized/1"
QUANTIZED_REQUIRED = ("spec_hash", "spec", "model", "quant", "source")


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (disk full, read-only, gone): names the file and the disk's free space."""


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


def state_digest(state: dict[str, Any]) -> str:
    """sha256 over a checkpoint's content, its "format" and "digest" entries aside: every tensor's dtype, shape and
    bytes, every other value's type and repr, containers with their sizes and keys, in order. One walk, no
    recursion (a loaded file is not trusted to be shallow)."""
    h = hashlib.sha256()
    stack: list[tuple[bool, Any]] = [(False, {k: v for k, v in state.items() if k not in ("format", "digest")})]
    while stack:
        is_key, value = stack.pop()
        if is_key:
            h.update(f"K{type(value).__name__}:{_safe_repr(value)};".encode("utf-8", "surrogatepass"))
        elif isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy().data)
        elif isinstance(value, dict):
            h.update(f"D{len(value)};".encode())
            for key, item in reversed(list(value.items())):
                stack += [(False, item), (True, key)]
        elif isinstance(value, (list, tuple)):
            h.update(f"L{len(value)};".encode())
            stack.extend((False, item) for item in reversed(value))
        else:
            h.update(f"V{type(value).__name__}:{_safe_repr(value)};".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _safe_repr(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 10_000:  # repr() refuses ints past 4300 digits
        return f"int:{value.bit_length()}:{hashlib.sha256(value.to_bytes((value.bit_length() + 8) // 8, 'little', signed=True)).hexdigest()}"
    return repr(value)


def save_checkpoint(path: Path, state: dict[str, Any], fmt: str = FORMAT) -> None:
    """Atomically write `state` (plus the format tag and its digest) to `path`: a temporary file beside it, flushed
    to disk, renamed over it. Raises CheckpointWriteError when the disk refuses; the previous file stays."""
    path = Path(path)
    payload = {"format": fmt, **state, "digest": state_digest(state)}
    tmp = None
    try:
        tmp = temp_path_beside(path)
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch reports a failed write as RuntimeError ("unexpected pos", ...)
        raise CheckpointWriteError(_write_error(path, e)) from None
    finally:
        if tmp is not None:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass


def _write_error(path: Path, e: BaseException) -> str:
    if isinstance(e, OSError):
        reason = e.strerror or str(e) or type(e).__name__
        if e.errno == errno.ENOSPC:
            reason = "no space left on the device"
    else:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    directory = path.parent
    try:
        free = shutil.disk_usage(directory if directory.exists() else Path.cwd()).free
        disk = f"; {free / (1 << 20):,.1f} MiB free on the disk holding {directory}"
    except OSError:
        disk = f"; the directory {directory} is not usable"
    return f"cannot write checkpoint {path}: {reason}{disk}"


def resolve(path: str | os.PathLike) -> Path:
    """A checkpoint file, or a run directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    if not path.is_file():
        if path.exists():  # a device (/dev/zero) or a FIFO: reading it would never end, or never start
            raise UserError(f"{path}: not a regular file (a device, FIFO or socket); expected a checkpoint file")
        raise UserError(f"{path}: no such checkpoint file")
    return path


def _read(path: Path) -> Any:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file: RuntimeError, UnpicklingError, EOFError, ...
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        if "weights_only" in first_line or "weights only" in first_line.lower():
            # torch's advice (weights_only=False) would run the file's pickled code: never repeated
            first_line = "it holds objects beyond tensors and plain data, which a safe load refuses"
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: {first_line})") from None
    return state


def _check_digest(path: Path, state: dict[str, Any]) -> None:
    stored = state.get("digest")
    if not isinstance(stored, str):
        raise UserError(f"{path}: checkpoint has no content digest; the file is damaged")
    if state_digest(state) != stored:
        remedy = ("quantize the run's checkpoint again (archspec quantize)" if state.get("format") == QUANTIZED_FORMAT
                  else "use another checkpoint of the run, or train it again")
        raise UserError(f"{path}: checkpoint is corrupted: its content does not match the digest stored when it "
                        f"was written; {remedy}")


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint on the CPU. Raises UserError for a missing, truncated, foreign, unsafe, corrupted (digest)
    or malformed (any field of the wrong type or size) file."""
    path = resolve(path)
    return _training_state(path, _read(path))


def _not_quantized(path: Path, state: Any, use: str) -> None:
    if isinstance(state, dict) and state.get("format") == QUANTIZED_FORMAT:
        source = state.get("source") if isinstance(state.get("source"), str) else "the run's own checkpoint"
        raise UserError(f"{path}: a quantized checkpoint (int8/int4 weights, no optimizer state) cannot be {use}: "
                        f"rounded weights cannot take gradient steps or be read as full precision; use the "
                        f"full-precision checkpoint it was made from ({printable(source, 200)})")


def _training_state(path: Path, state: Any) -> dict[str, Any]:
    _not_quantized(path, state, "resumed")
    if isinstance(state, dict) and state.get("format") == WEIGHTS_FORMAT:
        raise UserError(f"{path}: a weights checkpoint (model only, no optimizer or data position) cannot be resumed; "
                        "start a run from it with `archspec train SPEC --init-from` instead")
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, *LEGACY_FORMATS):
        raise UserError(f"{path}: not an archspec checkpoint (expected format {FORMAT!r})")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise UserError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    if state["format"] == FORMAT:
        _check_digest(path, state)
    else:
        _check_legacy_v1(path, state)
    problems = structure_problems(state)
    if problems:
        raise UserError(f"{path}: malformed checkpoint ({len(problems)} problem{'s' * (len(problems) > 1)})", problems)
    _check_finite(path, state["model"], "model")
    _check_finite(path, state["optimizer"].get("state", {}), "optimizer.state")
    return state


def _check_legacy_v1(path: Path, state: dict[str, Any]) -> None:
    """A file of the first format has no digest to verify: it is read only when its structure is exactly what that
    version wrote (its keys, its data position's keys, its RNG entries' keys), and with a warning."""
    extra = sorted(map(str, set(state) - LEGACY_V1_KEYS))
    data, rng = state.get("data"), state.get("rng")
    if not extra and isinstance(data, dict) and set(data) != LEGACY_V1_DATA_KEYS:
        extra = [f"data.{k}" for k in sorted(map(str, set(data) ^ LEGACY_V1_DATA_KEYS))]
    if not extra and isinstance(rng, list):
        extra = [f"rng[{i}]" for i, e in enumerate(rng) if not isinstance(e, dict) or not set(e) <= LEGACY_V1_RNG_KEYS
                 or not {"python", "torch"} <= set(e)][:3]
    if extra or "world_size" not in state:
        what = ", ".join(printable(k, 40) for k in extra[:5]) if extra else "world_size missing"
        raise UserError(f"{path}: claims the old format {state['format']!r} (no digest) but is not what that version "
                        f"wrote ({what}); an edited or damaged checkpoint is refused")
    warnings.warn(Caution(f"{path}: a checkpoint of the old format {state['format']!r} has no content digest; its integrity "
                  "cannot be verified (resume it and the next checkpoint written is verifiable)"), stacklevel=3)


def _check_finite(path: Path, tensors: Any, where: str) -> None:
    """NaN or infinite values in saved weights or optimizer moments are refused, naming the first tensor that holds
    them (training stops before a non-finite update is applied, so no checkpoint archspec writes holds one)."""
    stack: list[tuple[str, Any]] = [(where, tensors)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() or value.is_complex():
                if value.numel() and not bool(torch.isfinite(value).all()):
                    bad = "NaN" if bool(torch.isnan(value).any()) else "infinite"
                    raise UserError(f"{path}: {printable(name, 120)} holds {bad} values; the checkpoint is refused "
                                    "(resume from an earlier checkpoint)")
        elif isinstance(value, dict):
            stack.extend((f"{name}.{k}", v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{name}[{i}]", v) for i, v in enumerate(value))


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {printable(_safe_repr(value), 60)}"


def _is_int(value: Any) -> bool:
    return type(value) is int


def _rng_problems(where: str, entry: Any) -> list[str]:
    if not isinstance(entry, dict):
        return [f"{where}: expected a mapping of RNG states, got {_show(entry)}"]
    problems = []
    py = entry.get("python")
    try:
        version, internal, gauss = py  # type: ignore[misc]
        random.Random().setstate((version, tuple(internal), gauss))  # a scratch generator: validation only
    except (TypeError, ValueError, OverflowError):
        problems.append(f"{where}.python: not a Python RNG state (got {_show(py)})")
    t = entry.get("torch")
    expected = torch.get_rng_state()
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.shape != expected.shape:
        problems.append(f"{where}.torch: expected a uint8 tensor of shape {tuple(expected.shape)}, got {_show(t)}")
    else:
        try:
            torch.Generator().set_state(t)
        except RuntimeError as e:
            problems.append(f"{where}.torch: not a torch RNG state ({str(e).splitlines()[0][:100]})")
    if "cuda" in entry:
        cuda = entry["cuda"]
        if not isinstance(cuda, (list, tuple)) or not all(
                isinstance(c, torch.Tensor) and c.dtype == torch.uint8 and c.dim() == 1 for c in cuda):
            problems.append(f"{where}.cuda: expected a list of uint8 tensors, got {_show(cuda)}")
    return problems


def _model_problems(state: dict[str, Any]) -> list[str]:
    """The fields every checkpoint holds (training or weights): the model hash, the spec, the weights."""
    problems = []
    if not isinstance(state["spec_hash"], str):
        problems.append(f"spec_hash: expected text, got {_show(state['spec_hash'])}")
    if not isinstance(state["spec"], dict):
        problems.append(f"spec: expected a mapping, got {_show(state['spec'])}")
    model = state["model"]
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in model.items()):
        problems.append("model: expected a mapping of parameter names to tensors")
    return problems


def structure_problems(state: dict[str, Any]) -> list[str]:
    """Every field of a loaded checkpoint with the wrong type or size, one line each (empty: usable)."""
    problems: list[str] = []
    step = state["step"]
    if not _is_int(step) or step < 0:
        problems.append(f"step: expected a non-negative integer, got {_show(step)}")
    problems += _model_problems(state)
    opt = state["optimizer"]
    if not isinstance(opt, dict) or not isinstance(opt.get("state"), dict) or not isinstance(opt.get("param_groups"), list):
        problems.append("optimizer: expected an optimizer state_dict (state and param_groups)")
    rng = state["rng"]
    if not isinstance(rng, list) or not rng:
        problems.append(f"rng: expected a non-empty list (one entry per rank), got {_show(rng)}")
    else:
        for i, entry in enumerate(rng):
            problems += _rng_problems(f"rng[{i}]", entry)
    data = state["data"]
    if not isinstance(data, dict):
        problems.append(f"data: expected a mapping (the data position), got {_show(data)}")
    else:
        for key in ("epoch", "cursor", "seed", "seq_len", "n_windows"):
            if key not in data:
                problems.append(f"data.{key}: missing")
            elif not _is_int(data[key]) or data[key] < 0:
                problems.append(f"data.{key}: expected a non-negative integer, got {_show(data[key])}")
    if "tokenizer" in state:  # older checkpoints have none: sampling then asks the run directory or the spec
        problems += tokenizer_state_problems(state["tokenizer"])
    if "world_size" in state and (not _is_int(state["world_size"]) or state["world_size"] < 1):
        problems.append(f"world_size: expected a positive integer, got {_show(state['world_size'])}")
    return problems


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _identity(spec: Any) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it: the model, and the recipe fields that change what is
    learned (archspec.train.logger.learning_recipe). Names, compile, cadences are free to differ."""
    from archspec.train.logger import learning_recipe

    spec = spec if isinstance(spec, dict) else {}
    train = spec.get("train") if isinstance(spec.get("train"), dict) else {}
    learning = learning_recipe(train)
    # A resume may change the layout and with it the per-replica batch (the data position is per sample): the run key
    # judges the global batch, so one that changes it is recorded as a run of its own (Trainer._resumed_run_id)
    for key in ("world_size", "data_parallel", "batch_size"):
        learning.pop(key, None)
    return {"model": spec.get("model"), "train": learning}


def check_same_spec(path: Path, state: dict[str, Any], spec_json: dict) -> None:
    """A checkpoint continues only the run it came from: same model and same learning recipe. Checkpoints written
    before model identity (whose `spec_hash` also covered the name and the whole recipe) are judged the same way,
    from the spec they carry."""
    saved, now = _identity(state["spec"]), _identity(spec_json)
    if saved == now:
        return
    if saved["model"] is None:
        raise UserError(f"{path}: the checkpoint names no model (no `model` section in its spec); it cannot be "
                        "resumed: start the run afresh without --resume")
    a, b = _flatten(saved), _flatten(now)
    diffs = [f"{k}: checkpoint {a.get(k)!r}, now {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    raise UserError(f"{path}: checkpoint was saved for a different model or recipe; resume with the spec it was "
                    "trained with, or start a new run without --resume", diffs[:20])


def restore_modules(path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, TypeError) as e:
        raise UserError(f"{path}: model weights do not fit this model", str(e).strip().splitlines()[:10]) from None
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, RuntimeError, KeyError, TypeError) as e:
        raise UserError(f"{path}: optimizer state does not fit this model: {e}") from None


# ── sharded checkpoints (FSDP): torch.distributed.checkpoint ───────────────────────────────────────────────────────
# Every rank writes its own shards of the model and optimizer state into a directory named by the step; then rank 0
# writes checkpoint.pt as for any run (step, RNG states, data position, spec) with empty model/optimizer entries and
# the directory's name, so that the checkpoint file stays the one atomic commit point: a crash between the two leaves
# the previous checkpoint.pt pointing at the previous, complete directory. The state is saved by parameter name
# (`get_state_dict`), so it loads into any number of processes, FSDP or not, a single process included: DCP reshards
# on load.

METADATA = ".metadata"


def sharded_dirname(step: int) -> str:
    return f"checkpoint-step{step:08d}.dcp"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_sharded(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective (every rank calls it): write this rank's shards into `directory`. Returns the entries for
    checkpoint.pt that point at it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from archspec.train.tensor_parallel import checkpoint_state

    model_state, optim_state = get_state_dict(model, optimizer)
    checkpoint_state(model, model_state, optim_state)  # tensor parallelism's permuted rows back in natural order
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(directory))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return {"sharded": directory.name, "sharded_metadata_sha256": file_sha256(directory / METADATA)}


def sharded_directory(path: Path, state: dict[str, Any]) -> Path | None:
    """The directory of a sharded checkpoint beside `path`, checked against the digest checkpoint.pt holds (a torn
    or swapped directory is refused); None for a whole checkpoint. The digest proves integrity, not authenticity (whoever
    wrote the directory may have written checkpoint.pt too): what makes the directory safe to read is `load_sharded`,
    which never unpickles anything beyond plain data and DCP's own metadata classes."""
    name = state.get("sharded")
    if name is None:
        return None
    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith(".") or "\0" in name:
        raise UserError(f"{path}: its sharded state names {printable(repr(name), 80)}, not a directory beside it")
    directory = path.parent / name
    if not directory.is_dir() or directory.is_symlink() or not (directory / METADATA).is_file():
        raise UserError(f"{path}: its sharded state {name!r} is missing beside it (expected a directory {directory})")
    if file_sha256(directory / METADATA) != state.get("sharded_metadata_sha256"):
        raise UserError(f"{path}: {directory / METADATA} does not match the digest the checkpoint recorded")
    return directory


# DCP's metadata file is a pickle (FileSystemReader.read_metadata calls pickle.load), and DCP reads every non-tensor
# value of a state dict with torch.load(weights_only=False): both would run code a shared checkpoint carries. archspec
# reads them itself: the metadata through an unpickler that can build only the classes below (DCP's metadata
# dataclasses and the torch values they hold), the values with torch.load(weights_only=True).
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_METADATA_GLOBALS = frozenset({
    (_DCP_METADATA, "Metadata"), (_DCP_METADATA, "MetadataIndex"), (_DCP_METADATA, "StorageMeta"),
    (_DCP_METADATA, "TensorProperties"), (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "BytesStorageMetadata"), (_DCP_METADATA, "ChunkStorageMetadata"),
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib._local", "PosixPath"),
})
_METADATA_MAX_BYTES = 256 << 20  # DCP's metadata of a model with millions of tensors is still far smaller


class _MetadataUnpickler(pickle.Unpickler):
    """pickle's documented way to restrict globals: only DCP's metadata classes and torch dtypes resolve."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in sharded checkpoint metadata")


def read_dcp_metadata(path: Path) -> Any:
    """A DCP `.metadata` file, read without running code: a UserError names the file for anything else."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        size = path.stat().st_size
        if size > _METADATA_MAX_BYTES:
            raise UserError(f"{path}: {size:,} bytes, more than any sharded checkpoint's metadata; refused")
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
    except UserError:
        raise
    except Exception as e:  # UnpicklingError (a refused global), EOFError, ValueError, ... : not DCP's metadata
        raise UserError(f"{path}: not a safe sharded-checkpoint metadata file ({type(e).__name__}: "
                        f"{printable(str(e), 200)})") from None
    if not isinstance(metadata, Metadata):
        raise UserError(f"{path}: not a sharded-checkpoint metadata file (it holds {type(metadata).__name__})")
    return metadata


def _safe_dcp_reader(directory: Path) -> Any:
    """DCP's file reader, given the metadata archspec read safely (before DCP starts: a refusal names the file)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    safe_metadata = read_dcp_metadata(directory / METADATA)

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = safe_metadata  # archspec writes one global metadata file, never per-rank ones
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(directory))


def _safe_dcp_planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                obj = torch.load(value, weights_only=True)  # DCP's own planner: weights_only=False
            except Exception as e:
                raise UserError(f"sharded value {printable(read_item.dest_index.fqn, 120)} holds objects beyond "
                                f"tensors and plain data, which a safe load refuses ({type(e).__name__})") from None
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeLoadPlanner()


def load_sharded(path: Path, directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a sharded checkpoint into `model` and `optimizer` as they are held here (FSDP over any number of
    processes, or one process): each rank reads what it holds, through the safe reader and planner above."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from archspec.train.tensor_parallel import restore_state

    model_state, optim_state = get_state_dict(model, optimizer)
    finish = restore_state(model, model_state, optim_state)  # files hold natural row order; memory, under tp, not
    state = {"model": model_state, "optimizer": optim_state}
    reader = _safe_dcp_reader(directory)
    try:
        dcp.load(state, storage_reader=reader, planner=_safe_dcp_planner())
    except UserError as e:
        raise UserError(f"{path}: {e}", e.problems) from None
    except BaseException as e:  # DCP wraps what a rank raised in CheckpointException (a BaseException)
        failures = getattr(e, "failures", None) if type(e).__name__ == "CheckpointException" else None
        if failures is None and not isinstance(e, (RuntimeError, KeyError, ValueError, AssertionError, OSError)):
            raise
        causes = [f[0] if isinstance(f, tuple) else f for f in (failures or {}).values()]
        refused = [c for c in causes if isinstance(c, UserError)]
        if refused:
            raise UserError(f"{path}: {directory}: {refused[0]}") from None
        if any(isinstance(c, KeyboardInterrupt) for c in causes):
            raise KeyboardInterrupt from None
        e = causes[0] if causes else e
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise UserError(f"{path}: sharded state in {directory} does not fit this model: {type(e).__name__}: "
                        f"{printable(first)}") from None
    except (RuntimeError, KeyError, ValueError, AssertionError, OSError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise UserError(f"{path}: sharded state in {directory} does not fit this model: {type(e).__name__}: "
                        f"{printable(first)}") from None
    finish()
    _check_finite(directory, state["model"], "model")
    try:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    except (RuntimeError, KeyError, ValueError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise UserError(f"{path}: sharded state in {directory} does not fit this model: {type(e).__name__}: "
                        f"{printable(first)}") from None

# ── weights checkpoints: the model alone ─────────────────────────────────────────────────────────────────────────
#
# {"format": "archspec-weights/1", "spec_hash", "spec": the canonical spec dict (name, model, train) as in a training
#  checkpoint, "model": the generated module's state_dict, "tokenizer": {file name: text} (tokenizer.json and its
#  companions; empty when none), "source": where the weights came from, "digest"}
# Written by `archspec import-hf --checkpoint`; read by `export-hf`, `train --init-from` and `sample`, which also take
# a training checkpoint (or its run directory) wherever they take a weights checkpoint: `load_weights` reads both.


def save_weights(path: str | os.PathLike, spec_dict: dict[str, Any], model_hash: str,
                 model_state: dict[str, torch.Tensor], tokenizer: dict[str, str] | None = None,
                 source: str = "") -> None:
    """Atomically write a weights checkpoint (see above); CheckpointWriteError when the disk refuses."""
    save_checkpoint(Path(path), {"spec_hash": model_hash, "spec": spec_dict, "model": model_state,
                                 "tokenizer": dict(tokenizer or {}), "source": source}, fmt=WEIGHTS_FORMAT)


def load_weights(path: str | os.PathLike) -> dict[str, Any]:
    """A weights checkpoint, or the model part of a training checkpoint (file or run directory), verified (digest)
    and checked field by field: {"spec_hash", "spec", "model", "tokenizer", "source", "format"}; from a training
    checkpoint also "tokenizer_state", the run's tokenizer as `tokenizer_state` stored it (None in older files)."""
    path = resolve(path)
    state = _read(path)
    if isinstance(state, dict) and state.get("format") in (FORMAT, *LEGACY_FORMATS):
        state = _training_state(path, state)
        return {"format": state["format"], "spec_hash": state["spec_hash"], "spec": state["spec"],
                "model": state["model"], "tokenizer": {}, "source": str(path),
                "tokenizer_state": state.get("tokenizer")}  # the run's own tokenizer (None: saved before they travelled)
    return _weights_state(path, state)


def load_any(path: str | os.PathLike) -> dict[str, Any]:
    """A training checkpoint as `load_checkpoint` returns it, or a weights checkpoint as `load_weights` does (its
    "format" is WEIGHTS_FORMAT), read once: for readers of the model that take either (`archspec sample`)."""
    path = resolve(path)
    state = _read(path)
    if isinstance(state, dict) and state.get("format") == WEIGHTS_FORMAT:
        return _weights_state(path, state)
    if isinstance(state, dict) and state.get("format") == QUANTIZED_FORMAT:
        return _quantized_state(path, state)
    return _training_state(path, state)


def save_quantized(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Atomically write a quantized checkpoint (with its content digest): spec_hash, spec, model (plain tensors: the
    quantized parts), quant (archspec.quant.QuantPlan.to_json), source, tokenizer state or files, run_id."""
    save_checkpoint(Path(path), state, fmt=QUANTIZED_FORMAT)


def _quantized_state(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    missing = [k for k in QUANTIZED_REQUIRED if k not in state]
    if missing:
        raise UserError(f"{path}: incomplete quantized checkpoint, missing {', '.join(missing)}")
    _check_digest(path, state)
    problems = _model_problems(state)
    if not isinstance(state["quant"], dict):
        problems.append(f"quant: expected a mapping, got {_show(state['quant'])}")
    if "tokenizer" in state and state["tokenizer"] is not None:
        problems += tokenizer_state_problems(state["tokenizer"])
    files = state.get("tokenizer_files", {})
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        problems.append("tokenizer_files: expected a mapping of file names to text")
    if problems:
        raise UserError(f"{path}: malformed quantized checkpoint ({len(problems)} problem"
                        f"{'s' * (len(problems) > 1)})", problems)
    _check_finite(path, state["model"], "model")
    return state


def _weights_state(path: Path, state: Any) -> dict[str, Any]:
    _not_quantized(path, state, "exported or trained from")
    if not isinstance(state, dict) or state.get("format") != WEIGHTS_FORMAT:
        raise UserError(f"{path}: not an archspec checkpoint (expected format {WEIGHTS_FORMAT!r} or {FORMAT!r})")
    missing = [k for k in WEIGHTS_REQUIRED if k not in state]
    if missing:
        raise UserError(f"{path}: incomplete weights checkpoint, missing {', '.join(missing)}")
    _check_digest(path, state)
    problems = _model_problems(state)
    model = state["model"]
    tok = state["tokenizer"]
    if not isinstance(tok, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tok.items()):
        problems.append("tokenizer: expected a mapping of file names to text")
    if problems:
        raise UserError(f"{path}: malformed weights checkpoint ({len(problems)} problem{'s' * (len(problems) > 1)})",
                        problems)
    _check_finite(path, model, "model")
    return {"format": WEIGHTS_FORMAT, "spec_hash": state["spec_hash"], "spec": state["spec"], "model": model,
            "tokenizer": tok, "source": str(state.get("source", "")) or str(path)}


def load_weights_into(path: Path, weights: dict[str, Any], model: nn.Module) -> None:
    """Load a `load_weights` result into a generated module; a mismatch is a UserError naming the file."""
    try:
        model.load_state_dict(weights["model"])
    except (RuntimeError, KeyError, TypeError) as e:
        raise UserError(f"{path}: model weights do not fit this model", str(e).strip().splitlines()[:10]) from None


def weights_digest(model_state: dict[str, torch.Tensor]) -> str:
    """sha256 of a state_dict's names, dtypes, shapes and bytes: the identity of a run's starting weights."""
    return state_digest({"model": model_state})
