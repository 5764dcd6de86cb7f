"""Spellings a spec file may still use from earlier releases, mapped onto today's fields with a visible note.

A note is a `SpecNote` warning: the CLI prints it as `note: ...` on stderr (archspec.cli), Python shows it as a
UserWarning, and each distinct note is said once per command. The mapping is exact (the same model, the same
training), so a spec or a registry row written in the old spelling loads as the model it always described.

- `model.attention.positional.scale_embeddings: true|false` (on the sinusoidal kind) → `model.embedding_scale:
  sqrt_d_model|none`: scaling token embeddings is a model option of its own, independent of the positional kind.
  The unit says what its old field stands for (`KindUnit.model_options`); ModelSpec applies it and shows the note.
- `train.eval_batches: N` → `train.eval_tokens: N × batch_size × seq_len`: the validation set is sized in tokens, so
  it is the same for every variant of a sweep whatever its batch size.
"""

from __future__ import annotations

import warnings
from typing import Any

from archspec.errors import Note


class SpecNote(Note):
    """A spec used an old spelling (or relies on a changed default): loaded, and said so."""


def note(message: str) -> None:
    warnings.warn(SpecNote(message), stacklevel=2)


def migrate_spec(data: Any) -> Any:
    """A whole spec mapping: the `train.eval_batches` spelling (the `model:` spellings are ModelSpec's)."""
    if not isinstance(data, dict) or not isinstance(data.get("train"), dict) or "eval_batches" not in data["train"]:
        return data
    train = dict(data["train"])
    batches = train.pop("eval_batches")
    if not isinstance(batches, int) or isinstance(batches, bool) or batches < 1:
        train["eval_batches"] = batches  # not a count: left for the unknown-field error
        return {**data, "train": train}
    from archspec.spec.model import ModelSpec
    from archspec.spec.train import TrainSpec

    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    batch_size = train.get("batch_size", TrainSpec.model_fields["batch_size"].default)
    seq_len = train.get("seq_len") or model.get("context_length", ModelSpec.model_fields["context_length"].default)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in (batch_size, seq_len)):
        train["eval_batches"] = batches
        return {**data, "train": train}
    tokens = batches * batch_size * seq_len
    if "eval_tokens" in train and train["eval_tokens"] != tokens:
        raise ValueError(f"train.eval_batches: {batches} (an old spelling of train.eval_tokens: {tokens}) "
                         f"contradicts train.eval_tokens: {train['eval_tokens']}; keep one")
    train["eval_tokens"] = tokens
    note(f"train.eval_batches: {batches} is now train.eval_tokens: {tokens} ({batches} × batch_size {batch_size} × "
         f"seq_len {seq_len}): the validation set is sized in tokens; loaded as that")
    return {**data, "train": train}
