"""AdamW with weight decay on matrices only, and the learning-rate schedule (linear warmup, cosine to a floor).

Decay applies to every parameter with two or more dimensions: the attention and FFN matrices, the token embedding
(which is also the output head when tied) and a learned position table, as in GPT-2/nanoGPT. Norm gains and biases
are one-dimensional and are not decayed: shrinking a gain or a bias towards zero is not a useful prior. The rule is
the tensor's shape, with a name check (`norm`, `.bias`) as a guard for a future 2-D norm or bias parameter.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from archspec.spec.train import TrainSpec


def decays(name: str, param: torch.Tensor) -> bool:
    return param.ndim >= 2 and "norm" not in name.lower() and not name.endswith("bias")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups; tied parameters appear once (named_parameters skips repeats)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decay if decays(name, param) else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def build_optimizer(model: nn.Module, recipe: TrainSpec, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, recipe.weight_decay),
        lr=lr_at(0, recipe),
        betas=(recipe.beta1, recipe.beta2),
        eps=recipe.adam_eps,
        # One fused kernel over all parameters: on CPU ~6× faster than the foreach path (0.04 s vs 0.25 s for 30M
        # parameters on 2 cores), and as deterministic.
        fused=device.type in ("cpu", "cuda"),
    )


def lr_at(step: int, recipe: TrainSpec) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup from lr/warmup to lr over `warmup_steps`,
    then a half cosine from lr down to `min_lr_ratio · lr`, reached at the last step. A pure function of the step,
    so the schedule needs no state of its own in a checkpoint."""
    peak, floor = recipe.lr, recipe.lr * recipe.min_lr_ratio
    if step < recipe.warmup_steps:
        return peak * (step + 1) / recipe.warmup_steps
    decay_steps = max(1, recipe.steps - 1 - recipe.warmup_steps)
    progress = min(1.0, (step - recipe.warmup_steps) / decay_steps)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
