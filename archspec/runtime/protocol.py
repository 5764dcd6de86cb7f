"""The hooks a trainer may call on a generated model, declared once. A trainer (archspec.train: the loop, the pipeline
stages, the evaluation) calls these and nothing else of a model's inside: no attribute names (`router`, `experts`,
`attn`, `ffn`) outside the kind that defines them (tests/test_kinds.py guards this).

Every generated `Model` has `forward(idx, targets)`, `embed`, `through_blocks`, `head` and `blocks`; a kind adds the
hooks it needs as Model methods (a kind's `model_methods` template macro, archspec.kinds.base.FFNKind). A hook a model
does not define means "nothing to do" (`hooks_of` supplies that default), so a dense model and a MoE one are trained
by the same code:

    hooks = hooks_of(model)
    weights = hooks.auxiliary_weights()  # each auxiliary loss's weight (1 unless the model says otherwise)
    loss = model(x, y)[1] + sum(weights.get(k, 1.0) * v for k, v in hooks.auxiliary_losses().items())
    hooks.after_micro_batch()            # after each training forward (not evaluation)
    optimizer.step(); hooks.after_optimizer_step(all_sum)
    hooks.router_stats()                 # per-layer statistics of the last forward, for the evaluation's metrics
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import torch

HOOKS = ("auxiliary_losses", "auxiliary_weights", "after_micro_batch", "after_optimizer_step", "router_stats")


@runtime_checkable
class TrainingHooks(Protocol):
    """What a trainer may call on a generated model besides forward."""

    def auxiliary_losses(self) -> dict[str, torch.Tensor]:
        """Losses the model adds to the cross-entropy, from its last forward, by name (coefficients applied), each
        averaged over the layers that have it (MoE: `moe_aux`, `moe_z`). The trainer adds them to the loss."""
        ...

    def auxiliary_weights(self) -> dict[str, float]:
        """The weight of each auxiliary loss in the training loss, by name, where it is not 1 (multi-token prediction:
        λ / depth for each depth's loss, which `auxiliary_losses` reports unweighted so that it can be logged as is)."""
        ...

    def after_micro_batch(self) -> None:
        """Called after each training forward (not evaluation): state the model keeps over a step's micro-batches
        (MoE bias balancing: the expert loads)."""
        ...

    def after_optimizer_step(self, all_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Called after each applied optimizer update: updates outside the gradient. `all_sum` sums a tensor over the
        data-parallel replicas (in place or returned; None: one process)."""
        ...

    def router_stats(self) -> dict[str, torch.Tensor]:
        """Per-layer statistics of the last forward (detached), by name (`layer<i>.load`, ...)."""
        ...


class _Hooks:
    """A model's hooks, each defaulting to "nothing" where the model does not define it (looked up at each call: a
    hook set on the model later counts)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def defines(self, name: str) -> bool:
        return callable(getattr(self.model, name, None))

    def auxiliary_losses(self) -> dict[str, torch.Tensor]:
        return self.model.auxiliary_losses() if self.defines("auxiliary_losses") else {}

    def auxiliary_weights(self) -> dict[str, float]:
        return self.model.auxiliary_weights() if self.defines("auxiliary_weights") else {}

    def after_micro_batch(self) -> None:
        if self.defines("after_micro_batch"):
            self.model.after_micro_batch()

    def after_optimizer_step(self, all_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        if self.defines("after_optimizer_step"):
            self.model.after_optimizer_step(all_sum)

    def router_stats(self) -> dict[str, torch.Tensor]:
        return self.model.router_stats() if self.defines("router_stats") else {}


def hooks_of(model: torch.nn.Module) -> _Hooks:
    """The TrainingHooks of a generated model: its own methods, and a no-op for each it does not define."""
    return _Hooks(model)
