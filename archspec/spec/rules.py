"""Rules that relate several fields. Each problem is reported at its own field path with the valid range."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from archspec.spec.model import Spec

Problem = tuple[tuple[str, ...], str, Any]  # (field path, message, offending value)


def cross_field_problems(spec: "Spec") -> list[Problem]:
    m = spec.model
    att = m.attention
    out: list[Problem] = []
    p_att = ("model", "attention")

    if att.n_kv_heads is not None and (att.n_kv_heads > att.n_heads or att.n_heads % att.n_kv_heads):
        out.append((p_att + ("n_kv_heads",), f"must divide n_heads ({att.n_heads}), got {att.n_kv_heads}", att.n_kv_heads))
    if att.head_dim is None:
        out.append(
            (p_att + ("n_heads",),
             f"must divide d_model ({m.d_model}) when head_dim is not given, got {att.n_heads}; "
             f"set head_dim or pick n_heads in {_divisors(m.d_model)}", att.n_heads)
        )
    else:
        width = att.head_dim * att.n_heads
        if width > 8 * m.d_model:
            out.append((p_att + ("head_dim",),
                        f"n_heads·head_dim ({att.n_heads}·{att.head_dim} = {width}) must be at most 8·d_model "
                        f"({8 * m.d_model})", att.head_dim))
        if att.positional.kind == "rope" and att.head_dim % 2:
            out.append((p_att + ("head_dim",), f"must be even for rope (rotates pairs), got {att.head_dim}", att.head_dim))
    if att.positional.kind == "sinusoidal" and m.d_model % 2:
        out.append((("model", "d_model"), f"must be even for sinusoidal positions, got {m.d_model}", m.d_model))

    t = spec.train
    if t.seq_len is not None and t.seq_len > m.context_length:
        out.append((("train", "seq_len"), f"must be at most model.context_length ({m.context_length}), got {t.seq_len}", t.seq_len))
    if t.warmup_steps > t.steps:
        out.append((("train", "warmup_steps"), f"must be at most train.steps ({t.steps}), got {t.warmup_steps}", t.warmup_steps))
    tok = t.data.tokenizer
    if tok.kind == "bpe" and tok.vocab_size is not None and tok.vocab_size > m.vocab_size:
        out.append((("train", "data", "tokenizer", "vocab_size"),
                    f"must be at most model.vocab_size ({m.vocab_size}), got {tok.vocab_size}", tok.vocab_size))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]
