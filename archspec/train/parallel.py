"""Past one device: activation checkpointing per block and FSDP2 sharding, composed with the per-block compile.

The order is torchtitan's: checkpointing wraps each block's forward, then the loop compiles each block (Dynamo
traces `torch.utils.checkpoint` as one higher-order op, so the compiled graph recomputes in backward), then FSDP2
shards each block (`fully_shard`) and finally the root (embedding, final norm, head), so that one block's weights are
gathered at a time. The optimizer is built after sharding: it must hold the sharded (DTensor) parameters.

Parameter names do not change: checkpointing replaces a block's `forward` on the instance rather than wrapping the
module, and FSDP2 keeps names, so state dicts and checkpoints map one to one.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from archspec.train.distributed import World, full_value  # noqa: F401  (full_value: named here by callers)
from archspec.train.pipeline import held_blocks


def checkpointed_blocks(n_layers: int, ac) -> list[int]:
    """Indices of the blocks `ac` (train.activation_checkpointing) checkpoints."""
    if ac.kind == "full":
        return list(range(n_layers))
    if ac.kind == "every_k":
        return list(range(0, n_layers, ac.k))
    return []


def _recompute_in_backward(forward, *args, **kwargs):
    # Non-reentrant: works with torch.compile and FSDP2, and with inputs that do not require grad.
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, ac) -> list[int]:
    """Checkpoint the chosen blocks: each keeps only its inputs and recomputes its activations during backward (the
    RNG state is saved and restored, so dropout draws the same masks). Returns the indices checkpointed."""
    held = dict(held_blocks(model))  # under pipeline parallelism: this stage's blocks
    chosen = [i for i in checkpointed_blocks(len(model.blocks), ac) if i in held]
    for i in chosen:
        block = held[i]
        block.forward = functools.partial(_recompute_in_backward, block.forward)
    return chosen


def split_model(model: nn.Module, spec, mesh) -> None:
    """Tensor and expert parallelism, before anything else touches the model (torchtitan's order: TP/EP, then
    checkpointing, compile, data-parallel sharding). Each unit's plan decides what is split (archspec.kinds, through
    archspec.train.tensor_parallel); the MoE layers' experts go to their expert-parallel ranks
    (archspec.train.expert_parallel). Parameter names and global shapes do not change."""
    layout = mesh.layout
    if layout.tp > 1:
        from archspec.train.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, spec, mesh.tp, mesh)  # MoE layers under tp included (their plan delegates)
    elif layout.ep > 1 or layout.dp > 1:  # (dp alone: the router's statistics summed over the replicas)
        from archspec.train.expert_parallel import apply_moe_parallel, moe_layers

        for _, ffn in moe_layers(model):  # (a block another pipeline stage holds has none)
            apply_moe_parallel(ffn, mesh)


def shard_data_parallel(model: nn.Module, mesh, parallel, device: torch.device, mp) -> nn.Module:
    """The data-parallel axis of a mesh job (tp or ep > 1): FSDP2 over `mesh.dp` (kind fsdp), or replication over it
    (kind ddp: `replicate`, DDP's semantics on FSDP2's machinery, which takes the tensor-parallel DTensors plain DDP
    cannot). The experts of MoE layers under ep are replicated over the processes that hold the same experts
    (`mesh.dp_out`, their gradients reduced by their own hooks: archspec.train.expert_parallel.shard_experts) and left
    out of the wrapper; the rest is sharded or replicated over every data-parallel process. A data-parallel size of
    one leaves the model as it is. `mp`: the FSDP mixed-precision policy (archspec.train.precision.Precision).
    Returns the model, changed in place."""
    fsdp = parallel.kind == "fsdp"
    experts: set[nn.Parameter] = set()
    if mesh.layout.ep > 1:
        from archspec.train.expert_parallel import shard_experts

        experts = shard_experts(model, mesh, fsdp=fsdp)  # reduced over dp_out by their own hooks
    if mesh.layout.dp == 1:
        return model
    return _data_parallel(model, mesh.dp, fsdp, parallel, mp, ignored=experts)


def _data_parallel(model: nn.Module, dp_mesh, fsdp: bool, parallel, mp,
                   ignored: set[nn.Parameter] | None = None) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    ignored = ignored or None
    if not fsdp:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for _, block in held_blocks(model):
            replicate(block, mesh=dp_mesh, mp_policy=mp, ignored_params=ignored)
        replicate(model, mesh=dp_mesh, mp_policy=mp, ignored_params=ignored)
        return model
    for _, block in held_blocks(model):
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=parallel.reshard_after_forward,
                    ignored_params=ignored)
    # The root's parameters (embeddings, head) are used at both ends of the step: keeping them gathered after the
    # forward avoids gathering them again at once for the head's backward.
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False, ignored_params=ignored)
    return model


def shard_fsdp(model: nn.Module, world: World, parallel, mp) -> nn.Module:
    """FSDP2 over every process of `world` (pure data parallelism): each block is its own unit, then the root.
    Returns the model, changed in place (its parameters become sharded DTensors)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(world.device.type, (world.size,))
    return _data_parallel(model, mesh, True, parallel, mp)


def grad_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of the gradients of `params`, whatever mesh each lives on (tensor-parallel, data-parallel
    and expert weights are DTensors on different meshes, whose norms torch cannot stack): per mesh the norm of its
    DTensors' full values, then the norm of those. A plain tensor (on the first gradient's device)."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p.grad)
    if not groups:
        return torch.zeros(())
    norms = [full_value(torch.nn.utils.get_total_norm(grads)).float() for grads in groups.values()]
    device = norms[0].device
    return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]))


def clip_gradients(params: list[torch.Tensor], max_norm: float, *, counted: list[torch.Tensor] | None = None,
                   stage_sum=None) -> torch.Tensor:
    """Scale the gradients so their global norm (`grad_norm`) is at most `max_norm` (0: measure only); returns the
    norm before clipping. The scale is one number for every gradient, applied to each one's local values. Under
    pipeline parallelism the norm is over every stage: `counted` (this stage's parameters less those another stage
    counts: a tied weight once) gives the squared norm that `stage_sum` (a sum over the stages, in place) totals."""
    if stage_sum is None:
        norm = grad_norm(params)
    else:
        squared = grad_norm(params if counted is None else counted).reshape(1).square()
        norm = stage_sum(squared).sqrt().reshape(())
    if max_norm > 0:
        coef = min(1.0, max_norm / (float(norm) + 1e-6))
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm
