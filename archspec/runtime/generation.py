"""Generation: the sampling rule and the KV-cached decode loop every generated model's `stream()` and `generate()`
call. A model provides `new_cache(batch, max_len)`, `hidden_states(idx, cache)`, `head(x)` and `forward(idx, cache=)`;
the loop is the same for every architecture."""

from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.nn.functional as F


def next_token_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> torch.Tensor:
    """Logits (B, V) → the distribution to sample the next token from (B, V): logits / temperature, then only the
    top_k most likely tokens, then only the smallest set of them whose probability reaches top_p (nucleus)."""
    # In float64, less the largest logit first: any positive temperature, however small (1e-45), then sends the
    # others to -inf and keeps the largest at 0, never a NaN from inf - inf or 0 / 0.
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # (B, V), the largest 0
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)  # (B, V), float64
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V) each
        # Drop a token when the tokens ranked above it already reach top_p (the most likely one always stays: what
        # precedes it sums to 0, and 0 >= top_p never holds for a top_p > 0, however small, in float64).
        sorted_probs = sorted_probs.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs.float()


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Logits (B, V) → next token (B, 1); temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    return torch.multinomial(next_token_probs(logits, temperature, top_k, top_p), 1, generator=generator)


@torch.no_grad()
def stream(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, eos_id: int | None = None, generator: torch.Generator | None = None,
           context_length: int | None = None, decode: Callable | None = None,
           media: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
    """Continue idx (B, T) by up to max_new_tokens tokens, yielding each (B, 1) as soon as it is chosen.
    One forward over the prompt fills the KV cache (prefill); then each step runs only the newest token.
    Stops early once every row has produced eos_id (a finished row repeats it). `context_length`: the most
    positions the model takes (None: no limit, for models whose every layer attends within a window). `decode`: what
    runs each step after the prefill, (token (B, 1), cache) → logits (B, V), e.g. a compiled `DecodeStep`
    (archspec.runtime.decode); None: the model's forward, eager. `media`: a media model's media (its new_cache takes
    them and computes their keys and values once)."""
    B, T = idx.shape
    if context_length is not None and T + max_new_tokens > context_length:
        raise ValueError(f"{T} prompt + {max_new_tokens} new tokens exceed CONTEXT_LENGTH {context_length}")
    cache = model.new_cache(B, T + max_new_tokens) if media is None else model.new_cache(B, T + max_new_tokens,
                                                                                          media=media)
    # Prefill: the whole prompt in one forward; only its last position's logits are needed (B, V).
    logits = model.head(model.hidden_states(idx, cache)[:, -1:])[:, -1]
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    for step in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, top_p, generator)  # (B, 1)
        if eos_id is not None:
            token = token.masked_fill(done[:, None], eos_id)
            done |= token[:, 0] == eos_id
        yield token
        if step == max_new_tokens - 1 or done.all():
            return
        logits = model(token, cache=cache)[:, -1] if decode is None else decode(token, cache)  # (B, V)
