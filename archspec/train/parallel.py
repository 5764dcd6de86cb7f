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

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from archspec.train.distributed import World


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
    chosen = checkpointed_blocks(len(model.blocks), ac)
    for i in chosen:
        block = model.blocks[i]
        block.forward = functools.partial(_recompute_in_backward, block.forward)
    return chosen


def fsdp_mixed_precision(device: torch.device, amp_dtype: torch.dtype | None):
    """bf16 parameters (gathered in bf16, so matmuls run in bf16) with fp32 gradient reduction on CUDA; full fp32 on
    CPU, where bf16 has no fast kernels."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda" and amp_dtype is not None:
        return MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_fsdp(model: nn.Module, world: World, parallel, amp_dtype: torch.dtype | None) -> nn.Module:
    """FSDP2 over every process of `world`: each block is its own unit, then the root. Returns the model, changed in
    place (its parameters become sharded DTensors)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(world.device.type, (world.size,))
    mp = fsdp_mixed_precision(world.device, amp_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=parallel.reshard_after_forward)
    # The root's parameters (embeddings, head) are used at both ends of the step: keeping them gathered after the
    # forward avoids gathering them again at once for the head's backward.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a gradient norm under FSDP is a DTensor); plain tensors unchanged."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
