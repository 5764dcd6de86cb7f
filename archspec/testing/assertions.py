"""Checks that tests of generated modules share: causality, parameters counted on a built module, and the decoding
checks every mixer with a recurrent state passes (a rolled-back state, greedy generation)."""

from __future__ import annotations


def assert_causal(model, vocab_size: int, seq_len: int, position: int, *, batch: int = 2, seed: int = 0,
                  atol: float = 1e-5) -> None:
    """Change the token at `position` and check that logits before it are unchanged (within atol) and logits at
    it changed (so the check cannot pass on a model that ignores its input). Puts the model in eval mode."""
    import torch

    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab_size, (batch, seq_len), generator=g)
    changed = idx.clone()
    changed[:, position] = (idx[:, position] + torch.randint(1, vocab_size, (batch,), generator=g)) % vocab_size
    model.eval()
    with torch.no_grad():
        before, after = model(idx), model(changed)
    leak = (before[:, :position] - after[:, :position]).abs().max().item() if position else 0.0
    assert leak <= atol, f"logits before position {position} changed by {leak:.3g} (> {atol}): not causal"
    moved = (before[:, position] - after[:, position]).abs().max().item()
    assert moved > 0.0, f"logits at position {position} did not change with its token: the check is vacuous"



def assert_rollback_matches_full_forward(model, vocab_size: int, *, prefill: int = 8, drafts: int = 3,
                                         accepted: int = 1, after: int = 3, seed: int = 4, atol: float = 1e-5,
                                         rtol: float = 0.0) -> None:
    """Speculative decoding's rollback, on a generated model's caches: feed `prefill` tokens, then `drafts` draft
    tokens to caches that keep `drafts` positions to take back; take back all but the first `accepted` drafts; feed
    the `after` true tokens from there. Their logits must equal one full forward's over the true sequence. The
    rejected drafts are other tokens than the true ones, so a cache that only moves its length back (keeping the
    rejected positions' state) fails; taking back more than it keeps must raise ValueError ("take back") in the first
    layer's state (a recurrent one: a full-attention KV cache can take back any number)."""
    import torch

    start, length = prefill + accepted, max(prefill + accepted + after, prefill + drafts)
    idx = torch.randint(0, vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    draft = idx[:, prefill:prefill + drafts].clone()
    draft[:, accepted:] = (draft[:, accepted:] + 1) % vocab_size  # the rejected drafts: not the true tokens
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(1, length, dtype=torch.float32, rollback=drafts)
        model(idx[:, :prefill], cache=cache)
        model(draft, cache=cache)
        for c in cache:
            c.truncate(start)
        again = model(idx[:, start:start + after], cache=cache)
    torch.testing.assert_close(again, full[:, start:start + after], atol=atol, rtol=rtol)
    try:
        cache[0].truncate(1)  # more positions than it keeps
    except ValueError as e:
        assert "take back" in str(e), e
    else:
        raise AssertionError(f"a cache keeping {drafts} positions took back {start + after - 1} without a word")


def assert_greedy_generation_is_argmax_of_full_forwards(model, vocab_size: int, *, prompt_len: int = 4,
                                                        new_tokens: int = 10, seed: int = 6) -> None:
    """`model.generate(temperature=0)` (prefill, then the cached decode) gives the argmax of a full forward over the
    sequence so far, token by token."""
    import torch

    prompt = torch.randint(0, vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    out = model.generate(prompt, max_new_tokens=new_tokens, temperature=0)
    seq = prompt
    with torch.no_grad():
        for _ in range(new_tokens):
            seq = torch.cat([seq, model(seq)[:, -1:].argmax(-1)], dim=1)
    assert out.tolist() == seq.tolist(), (out.tolist(), seq.tolist())


def module_active_params(model) -> int:
    """Parameters one token uses, counted on a built module: all of them, except that a module holding stacked
    routed `experts` (leading dim n_experts) with `top_k` counts top_k / n_experts of its experts' parameters."""
    total = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        experts, top_k = getattr(module, "experts", None), getattr(module, "top_k", None)
        if experts is None or top_k is None:
            continue
        stacked = list(experts.parameters())
        n_experts = stacked[0].shape[0]
        routed = sum(p.numel() for p in stacked)
        assert routed % n_experts == 0
        total -= routed - routed // n_experts * top_k
    return total


def error_problems(stderr: str) -> list[str]:
    """The problem lines of an `error: ...` message as the CLI prints a UserError (UserError.render): one problem joins
    the message's line (`error: FILE: invalid spec: model.x: why` → ["model.x: why"]); several follow it, indented."""
    import re

    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    first = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    rest = [line.strip() for line in lines[first + 1:]]
    if rest:
        return rest
    one = re.match(r"error: .*?: invalid (?:spec|sweep|recipe)[^:]*: (.*)$", lines[first])
    return [one.group(1)] if one else []
