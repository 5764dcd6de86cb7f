"""Media + text (Flamingo's interleaved documents): a directory where each document `NAME.txt` has its media beside
it, `NAME.safetensors`, whose tensor `media` holds its items' precomputed features (items × tokens × width, from any
encoder). In the text, `<media>` (archspec.media.MARKER_TEXT) stands where each item sits, one per item, in order;
tokenised, each becomes the model's `media.marker_id` token.

    corpus/
      0001.txt            "<media> A red square on a white field. <media> The same square, rotated."
      0001.safetensors    media: (2, 16, 64)

The data hash covers the text and the media's bytes. `examples` reads every document (checked against model.media:
width, items, tokens, finite values); `windows` batches them one document per window, padded.

The shared training loop (archspec.train) passes no media to the model yet, so `archspec train` refuses this corpus
with that reason (its rules); the examples and windows are the API a loop that does will call.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import Field

from archspec.data.base import CORPUS_PATH, CorpusKind, TextSource, register
from archspec.errors import UserError, printable


@register
class MediaCorpus(CorpusKind):
    kind: Literal["media_text"] = "media_text"  # NAME.txt documents, each with NAME.safetensors (tensor `media`) beside it
    path: str = Field(description="a directory of NAME.txt documents, each with NAME.safetensors beside it")

    def open(self) -> "MediaSource":
        return MediaSource(self.path)

    def problems(self, spec: Any) -> list:
        if spec.model.media is None:
            return [(CORPUS_PATH + ("kind",), "the media corpus needs a model that takes media (model.media)", "media_text")]
        return [(CORPUS_PATH + ("kind",), "the shared training loop does not pass media to the model yet; train on "
                 "media + text through archspec.data.corpus.media (examples, windows) in your own loop", "media_text")]

    @classmethod
    def strategy(cls, bound: int):
        return None  # no spec with it trains (its rules), so property tests draw none


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
            if not text.with_suffix(".safetensors").is_file():
                raise UserError(f"{printable(str(text))}: no media beside it ({text.stem}.safetensors)")
        self.description = f"{len(self.texts)} media documents in {path}"

    def documents(self) -> Iterator[str]:
        for path in self.texts:
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{printable(str(path))}: not UTF-8 text") from None

    @cached_property
    def content_hash(self) -> str:
        h = hashlib.sha256()
        for path in self.texts:
            for part in (path.read_bytes(), path.with_suffix(".safetensors").read_bytes()):
                h.update(len(part).to_bytes(8, "little"))
                h.update(part)
        return h.hexdigest()

    def examples(self, encode, m: Any) -> list[tuple[list[int], Any]]:
        """Each document as (token ids with a marker per item, its media (items, tokens, width) checked against the
        model `m`); `encode(str) -> list[int]` is the tokenizer's."""
        from archspec.media import MARKER_TEXT, check_media, encode_with_markers, read_safetensors

        out = []
        for path, text in zip(self.texts, self.documents()):
            media_path = path.with_suffix(".safetensors")
            tensors = read_safetensors(media_path)
            if "media" not in tensors:
                raise UserError(f"{printable(str(media_path))}: no tensor named 'media'")
            media = check_media(tensors["media"], m, printable(str(media_path)))
            ids = encode_with_markers(encode, text, m.media.marker_id)
            if ids.count(m.media.marker_id) != media.size(0):
                raise UserError(f"{printable(str(path))}: {ids.count(m.media.marker_id)} {MARKER_TEXT} markers, its "
                                f"media holds {media.size(0)} items; one marker per item")
            out.append((ids, media))
        return out


def windows(examples: list, seq_len: int, batch_size: int, pad_id: int, generator=None):
    """Batches of whole documents, one per row: (idx (B, seq_len), targets (B, seq_len), media (B, items, tokens,
    width)); a document longer than seq_len + 1 tokens is cut (an item whose marker is cut off is then never seen),
    a shorter one padded with `pad_id` (targets -100), rows with fewer items padded with zero items that no marker
    names. Every item of the corpus must have the same number of tokens (one tensor per batch)."""
    import torch

    tokens = {media.size(1) for _, media in examples}
    if len(tokens) > 1:
        raise UserError(f"media corpus: items have {sorted(tokens)} tokens; a batch needs one count")
    order = torch.randperm(len(examples), generator=generator).tolist()
    for start in range(0, len(order) - batch_size + 1, batch_size):
        rows = [examples[i] for i in order[start : start + batch_size]]
        n_items = max(media.size(0) for _, media in rows)
        seq = torch.full((batch_size, seq_len + 1), pad_id, dtype=torch.long)
        targets = torch.full((batch_size, seq_len), -100, dtype=torch.long)
        media = torch.zeros(batch_size, n_items, *rows[0][1].shape[1:])
        for r, (ids, feats) in enumerate(rows):
            ids = ids[: seq_len + 1]
            seq[r, : len(ids)] = torch.tensor(ids)
            targets[r, : len(ids) - 1] = seq[r, 1 : len(ids)]
            media[r, : feats.size(0)] = feats
        yield seq[:, :-1], targets, media


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
