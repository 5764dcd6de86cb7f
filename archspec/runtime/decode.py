"""A compiled single-token decode step: what `stream(..., decode=DecodeStep(model, "whole"))` runs after the prefill.

    step = DecodeStep(model, "whole")          # or "cudagraphs" on a CUDA device
    for token in stream(model, idx, 100, temperature=0, decode=step): ...

The step is `model(token, cache=cache)[:, -1]`: the generated model's own forward, compiled, nothing rebuilt. A
generated model's KV cache (KVCache, LatentCache) hands attention the first `length` positions, `length` a Python int
that grows by one each step; compiled with static shapes, every step would be a new graph. So the step is compiled
with `dynamic=True`: dynamo traces the cache's `length` as a symbol from the first call on, and one graph serves every
step and every prompt length (with dynamo's default, automatic dynamic shapes, the first step's length would be
specialised and the second step would compile again: two graphs).

Modes: "whole" compiles the step with inductor. "cudagraphs" adds `mode="reduce-overhead"` (CUDA graph trees) and
marks the cache's tensors as static addresses, so that the step's in-place cache writes may be captured. CUDA graphs
fix shapes, and the attended length grows each step: graph trees record one CUDA graph per distinct length, so a
generation replays graphs only for the lengths an earlier generation met (same prompt length, same batch). The
prefill stays eager: it runs once per generation, at the prompt's length.

One CUDA graph for every step would need static shapes: attention over all `max_len` cached positions with a mask
of those stored, and the rotary angles gathered at a position tensor (as HF's StaticCache with `cache_position`
does). Today's generated attention reads `cache.length` as an int to slice its angles and keys and passes no mask
for a single query, so that needs the attention templates to take both from the cache; nothing here does it.
"""

from __future__ import annotations

import time

import torch

DECODE_MODES = ("none", "whole", "cudagraphs")


class DecodeStep:
    """token (B, 1) and the model's KV cache (filled by the prefill) → the next-token logits (B, V), through one
    compiled graph of the model's forward. Keep one per model: the graph is this object's (a new one compiles
    again). `compile_s`: seconds the first call took (dynamo's trace and inductor's compile, plus one step)."""

    def __init__(self, model: torch.nn.Module, mode: str = "whole") -> None:
        if mode not in ("whole", "cudagraphs"):
            raise ValueError(f"DecodeStep mode: expected whole or cudagraphs, got {mode!r}")
        self.model, self.mode = model, mode
        options = {"mode": "reduce-overhead"} if mode == "cudagraphs" else {}
        self._compiled = torch.compile(self._forward, dynamic=True, **options)
        self._marked: list | None = None  # the cache whose tensors were last marked static (cudagraphs)
        self.calls, self.compile_s = 0, 0.0

    def _forward(self, token: torch.Tensor, cache: list) -> torch.Tensor:
        return self.model(token, cache=cache)[:, -1]  # (B, V)

    def _mark_static(self, cache: list) -> None:
        # A CUDA graph replays fixed addresses; the cache is written in place each step, which graph trees capture
        # only for inputs known to keep their address (as parameters do).
        if cache is self._marked:
            return
        for layer in cache:
            for value in vars(layer).values():
                if isinstance(value, torch.Tensor):
                    torch._dynamo.mark_static_address(value)
        self._marked = cache

    def __call__(self, token: torch.Tensor, cache: list) -> torch.Tensor:
        if self.mode == "cudagraphs":
            self._mark_static(cache)
            # Each call starts a new step: the previous step's outputs (its logits, already sampled) may be reused.
            torch.compiler.cudagraph_mark_step_begin()
        t0 = time.perf_counter() if self.calls == 0 else 0.0
        logits = self._compiled(token, cache)
        if self.mode == "cudagraphs":
            logits = logits.clone()  # the graph's output buffer is overwritten by the next replay
        if self.calls == 0:
            self.compile_s = time.perf_counter() - t0
        self.calls += 1
        return logits
