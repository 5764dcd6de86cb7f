"""Media files for a model with media input (model.media, Flamingo): reading them safely, checking them against the
spec, and placing their markers in text.

A media file is safetensors: an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape
and byte range, then the raw bytes. It is read here without pickle and without any dependency (the format is
plain data): the header is bounded, every byte range must lie inside the file and match its shape. `archspec sample
--media FILE` reads the tensor `media`, items × tokens × width; the media corpus (archspec.data.corpus.media) one
tensor per document.

In text, MARKER_TEXT ("<media>") stands where an item sits; it becomes the spec's `media.marker_id` token.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import torch

from archspec.errors import UserError, printable

MARKER_TEXT = "<media>"
MAX_HEADER_BYTES = 1 << 20
MAX_FILE_BYTES = 4 << 30
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_safetensors(path: str | Path, what: str = "media file") -> dict[str, torch.Tensor]:
    """Every floating tensor of a safetensors file, by name; UserError (naming the file) for anything else."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} {printable(str(path))}: no such file")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise UserError(f"{what} {printable(str(path))}: {size:,} bytes, more than the {MAX_FILE_BYTES:,} allowed")
    data = p.read_bytes()
    bad = f"{what} {printable(str(path))}: not a safetensors file"
    if len(data) < 8:
        raise UserError(f"{bad} (shorter than its header length)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(data):
        raise UserError(f"{bad} (a header of {n:,} bytes)")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UserError(f"{bad} (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise UserError(f"{bad} (its header is not a mapping)")
    body = memoryview(data)[8 + n :]
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{what} {printable(str(path))}: tensor {printable(name, 80)}"
        if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
            dtype = info.get("dtype") if isinstance(info, dict) else None
            raise UserError(f"{where}: dtype {printable(str(dtype), 20)}, expected one of {', '.join(_DTYPES)}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40
                                                    for d in shape) or len(shape) > 8):
            raise UserError(f"{where}: shape {printable(str(shape), 60)} is not a list of sizes")
        dtype = _DTYPES[info["dtype"]]
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= len(body) or offsets[1] - offsets[0] != nbytes):
            raise UserError(f"{where}: its byte range {printable(str(offsets), 60)} does not fit the file or its shape")
        raw = bytearray(body[offsets[0] : offsets[1]])
        out[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape) if nbytes else torch.zeros(shape, dtype=dtype)
    return out


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """The inverse of read_safetensors (what tests and the example data write)."""
    header: dict[str, Any] = {}
    chunks, offset = [], 0
    for name, t in tensors.items():
        raw = t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(head)) + head + b"".join(chunks))


def check_media(media: torch.Tensor, m: Any, where: str, per_sequence: bool = True) -> torch.Tensor:
    """media (items, tokens, width) as the spec's model.media takes it, in fp32; UserError naming `where` and what is
    wrong (its width, too many items, too many or too few tokens, NaN or inf). `per_sequence=False`: a corpus
    document's media, any number of items (none for a text-only document): the windows the loop cuts are what must
    hold at most max_items, and archspec.train.media_data checks them."""
    spec = m.media
    if spec is None:
        raise UserError(f"{where}: this model takes no media (its spec has no model.media)")
    if media.dim() != 3:
        raise UserError(f"{where}: expected items × tokens × width (3 dimensions), got shape {tuple(media.shape)}")
    items, tokens, width = media.shape
    if width != spec.width:
        raise UserError(f"{where}: width {width}, the model's media width (model.media.width) is {spec.width}")
    if per_sequence and not 1 <= items <= spec.max_items:
        raise UserError(f"{where}: {items} items, the model takes 1 to {spec.max_items} (model.media.max_items)")
    limit = spec.resampler.max_input_tokens if spec.resampler is not None else None
    if limit is None and tokens != spec.tokens:
        raise UserError(f"{where}: {tokens} tokens per item, the model (no resampler) takes exactly {spec.tokens} "
                        "(model.media.tokens)")
    if limit is not None and not 1 <= tokens <= limit:
        raise UserError(f"{where}: {tokens} tokens per item, the resampler takes 1 to {limit} "
                        "(model.media.resampler.max_input_tokens)")
    media = media.float()
    if not torch.isfinite(media).all():
        bad = int((~torch.isfinite(media)).sum())
        raise UserError(f"{where}: {bad} values are NaN or infinite")
    return media


def load_media(path: str | Path, m: Any) -> torch.Tensor:
    """The tensor `media` of a safetensors file, checked against the model (check_media): (items, tokens, width)."""
    tensors = read_safetensors(path)
    where = f"--media {printable(str(path))}"
    if "media" not in tensors:
        names = ", ".join(printable(n, 40) for n in list(tensors)[:5]) or "none"
        raise UserError(f"{where}: no tensor named 'media' (it holds: {names})")
    return check_media(tensors["media"], m, where)


def encode_with_markers(encode, text: str, marker_id: int | None) -> list[int]:
    """Token ids of `text`, each MARKER_TEXT a `marker_id` token (None: left out, the text between them encoded as
    it is either way); `encode(str) -> list[int]` the tokenizer's."""
    ids: list[int] = []
    for i, piece in enumerate(text.split(MARKER_TEXT)):
        if i and marker_id is not None:
            ids.append(marker_id)
        if piece:
            ids.extend(encode(piece))
    return ids
