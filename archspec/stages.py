"""Pipeline stages by cost: which consecutive layers each pipeline stage holds (train.parallel.pp), torch-free.

    plan = plan_stages(spec, stages=4)       # StagePlan: ranges [(0, 3), (3, 5), ...], each stage's share
    plan.ranges[k]                            # layers [start, stop) of stage k
    plan.lines()                              # what `train --dry-run` prints, one line a stage

A stage's cost is the mean of its two shares: of the model's training FLOPs per token (what its time is; active
experts only, with each layer's attention at its own pattern's key count) and of its parameter bytes (what its
memory is: every expert, and the weights, gradients and AdamW moments scale with them). The embedding (and learned
positions, the embeddings' norm) sits on the first stage, the final norm and the output head on the last; a tied
head is held by both (its gradient is summed between them). The split minimises the largest stage cost over every
contiguous split (exactly, by dynamic programming), so an MoE-heavy or per-layer-varied spec balances where an
equal layer count would not.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from archspec.accounting import block_breakdown


@dataclass(frozen=True)
class StagePlan:
    ranges: tuple[tuple[int, int], ...]  # layers [start, stop) per stage
    flops: tuple[int, ...]  # forward FLOPs per token of each stage (its blocks; the head on the last)
    params: tuple[int, ...]  # parameters each stage holds (a tied embedding counted on the first and last)

    @property
    def stages(self) -> int:
        return len(self.ranges)

    def shares(self) -> list[tuple[float, float]]:
        """(FLOPs share, parameter share) of each stage."""
        f, p = sum(self.flops) or 1, sum(self.params) or 1
        return [(a / f, b / p) for a, b in zip(self.flops, self.params)]

    def stage_of_layer(self, layer: int) -> int:
        return next(k for k, (a, b) in enumerate(self.ranges) if a <= layer < b)

    def lines(self) -> list[str]:
        out = []
        for k, ((a, b), (fs, ps), n) in enumerate(zip(self.ranges, self.shares(), self.params)):
            layers = f"layer {a}" if b - a == 1 else f"layers {a}-{b - 1}"
            extra = [w for w, on in (("embedding", k == 0), ("head", k == self.stages - 1)) if on]
            out.append(f"stage {k}: {layers}{' + ' + ' + '.join(extra) if extra else ''} · {fs:.1%} of the FLOPs · "
                       f"{ps:.1%} of the parameters ({n:,})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"ranges": [list(r) for r in self.ranges], "flops_per_token": list(self.flops),
                "params": list(self.params)}


def layer_costs(spec: Any, seq_len: int | None = None) -> tuple[list[int], list[int], dict[str, int]]:
    """Forward FLOPs per token and parameters of each layer, and of the ends: `embed_params`, `head_params`,
    `head_flops` (the final norm, the head and its cross-entropy)."""
    m = spec.model
    seq_len = seq_len or getattr(spec.train, "seq_len", None) or m.context_length
    flops, params = [0] * m.n_layers, [0] * m.n_layers
    for group in block_breakdown(m, seq_len):
        for layer in group["layers"]:
            flops[layer], params[layer] = group["flops_forward"], group["params"]
    d, v = m.d_model, m.vocab_size
    norm = m.norm.params(d)
    embed = v * d + m.attention.positional.params(m) + (norm if m.embedding_norm else 0)
    head = v * d + (v if m.lm_head_bias else 0) + (norm if m.final_norm else 0)
    return flops, params, {"embed_params": embed, "head_params": head, "head_flops": 2 * d * v + 5 * v}


def plan_stages(spec: Any, stages: int, seq_len: int | None = None) -> StagePlan:
    """The split of spec's layers into `stages` consecutive stages of the least largest cost (module docstring)."""
    flops, params, ends = layer_costs(spec, seq_len)
    n = len(flops)
    if not 1 <= stages <= n:
        raise ValueError(f"{stages} stages for {n} layers")
    total_f = sum(flops) + ends["head_flops"]
    total_p = sum(params) + ends["embed_params"] + ends["head_params"]
    prefix_f, prefix_p = [0], [0]
    for f, p in zip(flops, params):
        prefix_f.append(prefix_f[-1] + f)
        prefix_p.append(prefix_p[-1] + p)

    def stage(a: int, b: int, k: int) -> tuple[int, int]:
        f = prefix_f[b] - prefix_f[a] + (ends["head_flops"] if k == stages - 1 else 0)
        p = prefix_p[b] - prefix_p[a] + (ends["embed_params"] if k == 0 else 0) \
            + (ends["head_params"] if k == stages - 1 else 0)
        return f, p

    def cost(a: int, b: int, k: int) -> float:
        f, p = stage(a, b, k)
        return 0.5 * f / (total_f or 1) + 0.5 * p / (total_p or 1)

    @lru_cache(maxsize=None)
    def best(a: int, k: int) -> tuple[float, tuple[int, ...]]:
        """Layers a.. over stages k..: (largest cost, the stops)."""
        if k == stages - 1:
            return cost(a, n, k), (n,)
        out: tuple[float, tuple[int, ...]] = (float("inf"), ())
        for b in range(a + 1, n - (stages - 1 - k) + 1):  # each later stage keeps at least one layer
            here = cost(a, b, k)
            if here >= out[0]:
                break  # the stage only grows with b: no later b does better
            rest, stops = best(b, k + 1)
            candidate = (max(here, rest), (b, *stops))
            if candidate[0] < out[0] or (candidate[0] == out[0] and not out[1]):
                out = candidate
        return out

    _, stops = best(0, 0)
    starts = (0, *stops[:-1])
    ranges = tuple(zip(starts, stops))
    figures = [stage(a, b, k) for k, (a, b) in enumerate(ranges)]
    return StagePlan(ranges, tuple(f for f, _ in figures), tuple(p for _, p in figures))
