"""Device choice and data-parallel plumbing. One code path: a single process is a world of size one.

Under `torchrun --nproc-per-node N` (which sets RANK, LOCAL_RANK and WORLD_SIZE) the loop joins a process group
(gloo on CPU, nccl on CUDA), wraps the model in DistributedDataParallel, reads its own slice of every global batch,
and leaves logging and checkpoints to rank 0. DDP keeps a full replica per process, so it scales throughput, not
model size; `train.parallel: {kind: fsdp}` shards the model instead (archspec.train.parallel).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from archspec.environment import ENV_INT_LIMIT, env_int
from archspec.errors import UserError

DEVICES = ("auto", "cpu", "cuda")


@dataclass
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this process created the group, so it also destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (a single process returns `values`)."""
        if not self.distributed:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum of `tensor` over ranks, in its own dtype (integers stay exact); in place."""
        if self.distributed:
            dist.all_reduce(tensor)
        return tensor

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average of `tensor` over ranks (a single process returns it unchanged)."""
        if not self.distributed:
            return tensor
        dist.all_reduce(tensor)  # a sum: gloo has no AVG
        return tensor / self.size

    def close(self, synchronize: bool = True) -> None:
        """Destroy the process group this process created. `synchronize` (the normal end) first waits for every rank,
        so no rank tears its gloo pairs down while a peer still talks to it; after a failure a peer may never arrive,
        so it is skipped. Drop the model and optimizer (whose DTensors and DDP reducer hold the group) before calling
        this: a group destroyed at interpreter exit aborts the process (`terminate called without an active
        exception`)."""
        if self.owns_group and dist.is_initialized():
            if synchronize:
                dist.barrier()
            dist.destroy_process_group()


def _env_int(name: str, default: int) -> int:
    # Ranks and sizes may be negative here so that the checks below name the inconsistency precisely.
    return env_int(name, default, minimum=-ENV_INT_LIMIT)


def resolve_device(requested: str, local_rank: int = 0) -> torch.device:
    if requested not in DEVICES:
        raise UserError(f"--device: must be one of {', '.join(DEVICES)}, got {requested!r}")
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False)")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise UserError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices")
    return torch.device("cuda", local_rank)


def world_env() -> tuple[int, int, int]:
    """(world size, rank, local rank) from torchrun's variables, checked for consistency: a rank without a world size
    (it would train alone and record nothing, as a non-zero rank), a rank outside the world, or a world without the
    rendezvous address torch.distributed needs are UserErrors naming the variables."""
    env = os.environ
    size = _env_int("WORLD_SIZE", 1)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if not env.get("WORLD_SIZE") and (rank or local_rank):
        raise UserError(f"$RANK={rank} / $LOCAL_RANK={local_rank} is set but $WORLD_SIZE is not: launch with "
                        "`torchrun --nproc-per-node N -m archspec train ...`, or unset RANK and LOCAL_RANK")
    if size < 1:
        raise UserError(f"$WORLD_SIZE must be at least 1, got {size}")
    if not 0 <= rank < size:
        raise UserError(f"$RANK={rank} is outside the world of $WORLD_SIZE={size} processes (0..{size - 1})")
    if local_rank < 0:
        raise UserError(f"$LOCAL_RANK must be 0 or more, got {local_rank}")
    if size > 1 and not dist.is_initialized():
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
        if missing:
            raise UserError(f"$WORLD_SIZE={size} but {' and '.join('$' + m for m in missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not set: launch with "
                            "`torchrun --nproc-per-node N -m archspec train ...`, which sets them")
        port = _env_int("MASTER_PORT", 0)
        if not 0 < port < 65536:
            raise UserError(f"$MASTER_PORT must be a port number (1..65535), got {port}")
    return size, rank, local_rank


def init_world(requested_device: str = "auto") -> World:
    """The process's place in the job: from torchrun's environment, else a world of one."""
    size, rank, local_rank = world_env()
    device = resolve_device(requested_device, local_rank)
    if size <= 1:
        return World(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=size,
                                device_id=device if device.type == "cuda" else None)
    return World(rank=rank, local_rank=local_rank, size=size, device=device, owns_group=owns)


def wrap_ddp(model: nn.Module, world: World) -> nn.Module:
    if not world.distributed:
        return model
    return DistributedDataParallel(model, device_ids=[world.device.index] if world.device.type == "cuda" else None)


def no_sync(model: nn.Module, sync: bool) -> AbstractContextManager:
    """Skip the gradient all-reduce (DDP) or reduce-scatter (FSDP2) on all but the last micro-batch of an
    accumulated step."""
    if isinstance(model, DistributedDataParallel):
        return nullcontext() if sync else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # an FSDP2 module
        model.set_requires_gradient_sync(sync)
    return nullcontext()


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a gradient norm under FSDP is a DTensor); plain tensors unchanged."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
