"""Checks that tests of generated modules share: causality, and parameters counted on a built module."""

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
