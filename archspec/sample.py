"""Sampling from a model: what `archspec sample` loads, and speculative decoding.

Every generated model generates by itself (`generate()`, `stream()`: its KV cache and archspec.runtime's sampling rule
and decode loop). This module prepares prompts, checks lengths, resolves the compiled decode, and runs two models together for
speculative decoding; finding the model and its tokenizer is archspec.loading's (`load_model`, named here too).

    loaded = load_model("runs/llama-like-tiny-1a2b3c4d5e6f", device="cpu")
    ids = encode_prompt(loaded.tokenizer, "def main(")
    for token in loaded.model.stream(ids, 100, temperature=0.8, eos_id=loaded.tokenizer.eos_id): ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

from archspec.errors import UserError
from archspec.loading import DTYPES, Loaded, load_model, resolve_source  # noqa: F401  (the CLI's names, here)
from archspec.runtime import next_token_probs as probs_of
from archspec.spec import Spec
from archspec.train.tokenizer import Tokenizer

# ── prompts and limits ───────────────────────────────────────────────────────────────────────────────────────────


def encode_prompt(tokenizer: Tokenizer, text: str, device: str | torch.device = "cpu") -> torch.Tensor:
    """(1, T) ids. An empty prompt starts from EOS, which is what precedes every document in training."""
    ids = tokenizer.encode_batch([text])[0].tolist() if text else []
    if not ids:
        if tokenizer.eos_id is None:
            raise UserError("an empty prompt starts from EOS, and this tokenizer names none: pass --prompt")
        ids = [tokenizer.eos_id]
    return torch.tensor([ids], dtype=torch.long, device=device)


def check_length(spec: Spec, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a prompt + max_new_tokens past context_length, unless the model can run past it (every layer windowed,
    relative positions: `past_context_refusal`), whose caches then roll."""
    from archspec.kinds.attention import past_context_refusal

    limit = spec.model.context_length
    if prompt_tokens + max_new_tokens > limit:
        why = past_context_refusal(spec.model)
        if why is None:
            return
        room = limit - prompt_tokens
        fix = (f"lower --max-new-tokens to {room}" if room > 0
               else f"shorten the prompt to at most {limit - 1} tokens")
        tokens = f"{prompt_tokens} token{'s' * (prompt_tokens != 1)}"
        total = prompt_tokens + max_new_tokens
        raise UserError(f"prompt ({tokens}) + --max-new-tokens {max_new_tokens} = {total} exceeds context_length "
                        f"{limit} of {spec.name}; {fix} (only a model whose every layer attends within a window, "
                        f"with relative or no positions, generates past its context: {why})")


class TextStream:
    """Token ids in, printable text out as soon as it is whole: a multi-byte character split across byte tokens is
    held back until its last byte arrives (decoding everything so far and emitting only what is new)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""

    def push(self, token: int) -> str:
        if token >= self.tokenizer.vocab_size:
            return ""  # an id the model has but the tokenizer does not (a padded vocabulary)
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""  # an incomplete character: wait for its remaining bytes
        new, self.shown = text[len(self.shown):], text
        return new

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids)
        new, self.shown = text[len(self.shown):], text
        return new


# ── compiled decode ──────────────────────────────────────────────────────────────────────────────────────────────


def resolve_decode_compile(mode: str, spec: Spec, device: torch.device, *, draft: bool = False,
                           quantized: bool = False) -> tuple[str, str]:
    """The mode `archspec sample --compile MODE` decodes with (none | whole | cudagraphs: archspec.runtime.decode), and
    why; a fallback names what refused the asked mode, as the training loop's compile modes do
    (archspec.train.compile.resolve_compile)."""
    from archspec.train.compile import has_cxx

    asked = f"--compile {mode}"
    if mode == "none":
        return "none", asked
    if draft:
        return "none", (f"{asked} refused: speculative decoding feeds each model a varying number of tokens per "
                        "forward (the verify, the draft's catch-up), not one; decoding eager")
    if quantized:
        return "none", f"{asked} refused: quantized weights are not tried under torch.compile here; decoding eager"
    if device.type == "cpu" and not has_cxx():
        return "none", f"{asked} refused: no C++ compiler found: torch.compile needs one on CPU; decoding eager"
    refusals = decode_compile_refusals(spec)
    if refusals:
        return "none", f"{asked} refused: {'; '.join(refusals)}; decoding eager"
    if mode == "cudagraphs" and device.type != "cuda":
        return "whole", f"{asked} refused: CUDA graphs need a CUDA device (this run is on {device.type}); using whole"
    return mode, asked


def decode_compile_refusals(spec: Spec) -> list[str]:
    """Why this model cannot decode through one compiled graph, one reason per unit that says so (empty: it can)."""
    m = spec.model
    out: list[str] = []
    for unit in m.units():
        why = unit.decode_compile_refusal(m)
        if why and why not in out:
            out.append(why)
    return out


# ── speculative decoding ─────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class SpeculativeStats:
    drafted: int = 0  # tokens the draft proposed
    accepted: int = 0  # of those, kept by the target
    target_forwards: int = 0  # one per round: the verify forward
    rounds: list[int] = field(default_factory=list)  # accepted per round

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def same_tokenizer(a: Tokenizer, b: Tokenizer) -> bool:
    if a.kind != b.kind:
        return False
    if callable(getattr(a, "same_as", None)):  # the tokenizer kinds of archspec.data
        return a.same_as(b)
    return a._hf.to_str() == b._hf.to_str() and a.eos_id == b.eos_id  # type: ignore[attr-defined]


@torch.no_grad()
def speculative_stream(target: nn.Module, draft: nn.Module, idx: torch.Tensor, max_new_tokens: int, *, k: int = 4,
                       temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                       eos_id: int | None = None, generator: torch.Generator | None = None,
                       stats: SpeculativeStats | None = None) -> Iterator[int]:
    """Yield up to max_new_tokens tokens continuing idx (1, T), the target's distribution exactly (Leviathan et al.,
    2023; Chen et al., 2023): each round the draft proposes up to k tokens one by one, the target scores them all in
    one forward, and the longest prefix the target agrees with is kept, plus one token of the target's own (its
    correction at the first disagreement, or the next token when all k are kept). Greedy (temperature 0): a draft
    token is kept when it is the target's argmax, so the output is token for token the target's greedy output.
    Sampling: kept with probability min(1, p/q), the correction drawn from max(p - q, 0) renormalised.

    Both models keep KV caches; after each round they are truncated to the tokens kept, and each model is fed
    whatever its cache lacks. Distributions use the rule every generated model samples by (archspec.runtime's
    `next_token_probs`)."""
    if idx.size(0) != 1:
        raise ValueError("speculative decoding runs one sequence at a time")
    stats = stats if stats is not None else SpeculativeStats()
    device = idx.device
    tokens = idx[0].tolist()
    limit = len(tokens) + max_new_tokens
    # Each round may take back up to k positions: a window layer keeps k more than its window so that it still can.
    t_cache, d_cache = target.new_cache(1, limit, rollback=k), draft.new_cache(1, limit, rollback=k)
    if len(tokens) > 1:  # prefill with all but the last prompt token; each round feeds what a cache lacks
        target(idx[:, :-1], cache=t_cache)
        draft(idx[:, :-1], cache=d_cache)
    greedy = temperature == 0

    def dist(logits: torch.Tensor, size: int) -> torch.Tensor:  # (1, V) → (size,), padded with zeros
        p = probs_of(logits, temperature, top_k, top_p)[0]
        return torch.nn.functional.pad(p, (0, size - p.numel()))

    vocab = max(target.lm_head.out_features, draft.lm_head.out_features)
    while len(tokens) < limit:
        n_draft = min(k, limit - len(tokens) - 1)  # the round always adds one token of the target's own
        drafted: list[int] = []
        q_rows: list[torch.Tensor] = []
        for _ in range(n_draft):
            seq = tokens + drafted
            logits = draft(torch.tensor([seq[d_cache[0].length:]], device=device), cache=d_cache)[:, -1]
            if greedy:
                drafted.append(int(logits.argmax()))
            else:
                q = dist(logits, vocab)
                q_rows.append(q)
                drafted.append(int(torch.multinomial(q, 1, generator=generator)))
        seq = tokens + drafted
        logits = target(torch.tensor([seq[t_cache[0].length:]], device=device), cache=t_cache)[0, -(n_draft + 1):]
        stats.target_forwards += 1
        accepted = 0
        for i, token in enumerate(drafted):
            if greedy:
                keep = int(logits[i].argmax()) == token
            else:
                p = dist(logits[i : i + 1], vocab)
                ratio = p[token] / q_rows[i][token]
                keep = bool(torch.rand((), generator=generator, device=device) < ratio)
            if not keep:
                break
            accepted += 1
        if greedy:
            correction = int(logits[accepted].argmax())
        else:
            p = dist(logits[accepted : accepted + 1], vocab)
            if accepted < n_draft:  # rejected: draw from where the target has more mass than the draft
                residual = (p - q_rows[accepted]).clamp(min=0)
                p = residual / residual.sum() if residual.sum() > 0 else p
            correction = int(torch.multinomial(p, 1, generator=generator))
        stats.drafted += n_draft
        stats.accepted += accepted
        stats.rounds.append(accepted)
        kept = len(tokens) + accepted  # positions whose keys/values are right in both caches
        for c in (*t_cache, *d_cache):
            c.truncate(kept)
        for token in drafted[:accepted] + [correction]:
            tokens.append(token)
            yield token
            if token == eos_id:
                return


# ── self-speculative decoding: the model's own multi-token prediction modules draft (model.mtp) ────────────────────


@torch.no_grad()
def mtp_speculative_stream(model: nn.Module, idx: torch.Tensor, max_new_tokens: int, *, depth: int | None = None,
                           eos_id: int | None = None, stats: SpeculativeStats | None = None,
                           trace: list | None = None) -> Iterator[int]:
    """Yield up to max_new_tokens tokens continuing idx (1, T), token for token the model's greedy output, drafted by
    its own MTP modules (DeepSeek-V3 §2.2 used as self-speculative decoding). Each round, one forward of the model
    reads what its cache lacks — the last token and the previous round's drafts — and keeps the longest prefix of
    drafts it agrees with plus its own next token; from the same forward's hidden state at the last position it
    read, depth 1 drafts the token after that next token, depth 2 the one after, and so on (`depth` of them, at most
    model.mtp.depth).

    Depth k's cache holds the positions whose inputs are all decided (its hidden state of depth k - 1 and the token
    k ahead); the positions it reads drafts at are recomputed the next round, so each depth sees what it was trained
    on. Greedy only: sampling would need the draft's distribution in the acceptance test (`speculative_stream` does
    that for a separate draft model). `trace`, when given, gets (tokens decided, drafts) of every round."""
    if idx.size(0) != 1:
        raise ValueError("speculative decoding runs one sequence at a time")
    depth = min(depth or len(model.mtp), len(model.mtp))
    stats = stats if stats is not None else SpeculativeStats()
    device = idx.device
    tokens = idx[0].tolist()
    limit = len(tokens) + max_new_tokens
    t_cache = model.new_cache(1, limit, rollback=depth + 1)
    m_cache = model.mtp_new_cache(1, limit, rollback=depth + 1)[:depth]
    final_norm = getattr(model, "final_norm", None)
    # carry[k]: depth k's hidden states at its last decided position(s), (first position, (1, P, D)), which depth
    # k + 1 reads the next round before depth k's new rows
    carry: list[tuple[int, torch.Tensor] | None] = [None] * (depth + 1)
    drafted: list[int] = []
    while len(tokens) < limit:
        n = len(tokens)
        start = t_cache[0].length  # the model reads seq[start:]: the tokens its cache lacks, then the drafts
        seq = tokens + drafted
        x = model.hidden_states(torch.tensor([seq[start:]], device=device), t_cache)  # (1, T, D)
        logits = model.head(x)[0]  # (T, V): row j predicts position start + j + 1
        stats.target_forwards += 1
        row = n - 1 - start  # the row that predicts position n, the first draft's
        accepted = 0
        while accepted < len(drafted) and int(logits[row + accepted].argmax()) == drafted[accepted]:
            accepted += 1
        own = int(logits[row + accepted].argmax())
        if drafted:
            stats.drafted += len(drafted)
            stats.accepted += accepted
            stats.rounds.append(accepted)
        for c in t_cache:  # the positions read with decided tokens: all but the model's own new one
            c.truncate(n + accepted)
        for token in drafted[:accepted] + [own]:
            tokens.append(token)
            yield token
            if token == eos_id or len(tokens) >= limit:
                return
        # Draft the next round from the hidden states of positions start .. last (all decided now).
        n = len(tokens)
        last = n - 2  # the last position the model has read; depth k there predicts position last + k + 1
        h = final_norm(x) if final_norm is not None else x
        states = (start, h[:, : last - start + 1])  # depth 0 at positions start .. last
        drafted = []
        for k in range(1, min(depth, limit - n - 1) + 1):
            cache = m_cache[k - 1]
            first = cache.length  # depth k reads positions first .. last
            s0, rows = states
            inputs = rows[:, first - s0 :]
            seq = tokens + drafted  # the token k ahead of position i: decided, or one of this round's drafts
            new, logits_k = model.mtp_forward(k, inputs, torch.tensor([seq[first + k : last + k + 1]], device=device),
                                              cache)
            drafted.append(int(logits_k[0, -1].argmax()))
            decided = max(0, n - k)  # positions below n - k have their token k ahead decided
            cache.truncate(decided)
            before = carry[k]
            full = new if before is None else torch.cat([before[1], new], dim=1)
            full_start = first if before is None else before[0]
            states = (full_start, full)  # depth k at positions full_start .. last, for depth k + 1 now
            keep = max(0, decided - 1)  # depth k + 1's cache will start there next round
            carry[k] = (keep, full[:, keep - full_start : decided - full_start]) if decided > full_start else None
        if trace is not None:
            trace.append((list(tokens), list(drafted)))
