"""Media + text (Flamingo's interleaved documents): a directory where each document `NAME.txt` has its media beside
it, `NAME.safetensors`, whose tensor `media` holds its items' precomputed features (items × tokens × width, from any
encoder). In the text, `<media>` (archspec.media.MARKER_TEXT) stands where each item sits, one per item, in order;
tokenised, each becomes the model's `media.marker_id` token.

    corpus/
      0001.txt            "<media> A red square on a white field. <media> The same square, rotated."
      0001.safetensors    media: (2, 16, 64)

The data hash covers the text and the media's bytes. `examples` reads every document (checked against model.media:
width, items, tokens, finite values); the shared training loop packs them into windows that carry their items
(archspec.train.media_data). A text-only model (no model.media) reads the text only: the markers are dropped and
the media never read.
"""

from __future__ import annotations

import hashlib
import os
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import Field

from archspec.data.base import CorpusKind, TextSource, register
from archspec.errors import UserError, printable


@register
class MediaCorpus(CorpusKind):
    kind: Literal["media_text"] = "media_text"  # NAME.txt documents, each with NAME.safetensors (tensor `media`) beside it
    path: str = Field(description="a directory of NAME.txt documents, each with NAME.safetensors beside it")

    def open(self) -> "MediaSource":
        return MediaSource(self.path)

    carries_media = True

    @classmethod
    def strategy(cls, bound: int):
        return None  # a directory of documents and media files must exist: property tests draw none


class MediaSource(TextSource):
    """The documents in name order; `content_hash` covers each text and its media file's bytes."""

    def __init__(self, path: str):
        root = Path(path).expanduser()
        if not root.is_dir():
            raise UserError(f"train.data.corpus.path: no such directory: {printable(path)}")
        self.texts = sorted(p for p in root.glob("*.txt") if not p.name.startswith("."))
        if not self.texts:
            raise UserError(f"train.data.corpus.path: {printable(path)} holds no NAME.txt documents")
        for text in self.texts:
            # a FIFO or a device would be read without end, a directory not at all: regular files only, named
            for entry, what in ((text, "a document"), (text.with_suffix(".safetensors"), "its media")):
                if entry.exists() and not entry.is_file():
                    raise UserError(f"{printable(str(entry))}: not a regular file (a directory, device, FIFO or "
                                    f"socket); expected {what}")
            if not text.with_suffix(".safetensors").is_file():
                raise UserError(f"{printable(str(text))}: no media beside it ({text.stem}.safetensors)")
        self.description = f"{len(self.texts)} media documents in {path}"

    def documents(self) -> Iterator[str]:
        """Each document's text with its markers left out (what a tokenizer learns from: a marker is not text)."""
        from archspec.media import MARKER_TEXT

        for text in self.texts_with_markers():
            yield text.replace(MARKER_TEXT, "")

    def texts_with_markers(self) -> Iterator[str]:
        for path in self.texts:
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{printable(str(path))}: not UTF-8 text") from None
            except OSError as e:
                raise UserError(f"{printable(str(path))}: cannot read: {e.strerror or e}") from None

    @cached_property
    def content_hash(self) -> str:
        h = hashlib.sha256()
        for path in self.texts:
            for part in (path, path.with_suffix(".safetensors")):  # streamed: a media file may exceed memory
                try:
                    with open(part, "rb") as f:
                        h.update(os.fstat(f.fileno()).st_size.to_bytes(8, "little"))
                        while chunk := f.read(1 << 20):
                            h.update(chunk)
                except OSError as e:
                    raise UserError(f"{printable(str(part))}: cannot read: {e.strerror or e}") from None
        return h.hexdigest()

    def examples(self, encode, m: Any) -> list[tuple[list[int], Any]]:
        """Each document as (token ids, its media (items, tokens, width) checked against the model `m`): a marker
        token (m.media.marker_id) where each item sits. For a text-only model (`m.media` None): the text's ids alone
        (markers dropped) and None, the media not read. `encode(str) -> list[int]` is the tokenizer's."""
        from archspec.media import MARKER_TEXT, check_media, encode_with_markers, read_safetensors

        out = []
        marker = m.media.marker_id if m.media is not None else None
        for path, text in zip(self.texts, self.texts_with_markers()):
            ids = encode_with_markers(encode, text, marker)
            if marker is None:
                out.append((ids, None))
                continue
            media_path = path.with_suffix(".safetensors")
            tensors = read_safetensors(media_path)
            if "media" not in tensors:
                raise UserError(f"{printable(str(media_path))}: no tensor named 'media'")
            media = check_media(tensors["media"], m, printable(str(media_path)), per_sequence=False)
            if ids.count(marker) != media.size(0):
                raise UserError(f"{printable(str(path))}: {ids.count(marker)} {MARKER_TEXT} markers, its "
                                f"media holds {media.size(0)} items; one marker per item")
            out.append((ids, media))
        return out


def write_example(directory: str | Path, documents: int = 4, width: int = 64, tokens: int = 16, seed: int = 0) -> Path:
    """A small media corpus, generated deterministically from `seed` (no download): each document names the colour
    of one or two "images" whose features are that colour's code plus noise."""
    import torch

    from archspec.media import MARKER_TEXT, write_safetensors

    colours = ["red", "green", "blue", "yellow", "black", "white"]
    g = torch.Generator().manual_seed(seed)
    codes = torch.randn(len(colours), width, generator=g)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for d in range(documents):
        n = 1 + d % 2
        picks = torch.randint(0, len(colours), (n,), generator=g).tolist()
        text = " ".join(f"{MARKER_TEXT} This square is {colours[c]}." for c in picks)
        feats = codes[picks][:, None, :] + 0.1 * torch.randn(n, tokens, width, generator=g)
        (root / f"{d:04d}.txt").write_text(text, encoding="utf-8")
        write_safetensors(root / f"{d:04d}.safetensors", {"media": feats})
    return root
