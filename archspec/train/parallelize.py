"""`parallelize(model, build, mesh)`: everything that makes one generated (single-device) model train on a job's
processes, applied here and nowhere else, in one fixed order (torchtitan's):

  0. pipeline cut (pp > 1): the model is cut down to this process's stages, so each later step sees its own blocks;
  1. tensor and expert parallelism (train.parallel.tp / ep: each unit's plan, archspec.train.tensor_parallel and
     archspec.train.expert_parallel);
  2. activation checkpointing (train.activation_checkpointing);
  3. compile (train.compile, as archspec.train.compile resolves it);
  4. data parallelism: FSDP2 / replicate over the mesh's dp axis, FSDP2 over every process, or DDP;
  5. the pipeline's schedule over the stages (after sharding: its stages run the sharded modules).

The steps taken are printed in the run's start lines (`Parallelized.describe`). The model changes in place; its
parameter names do not (checkpoints map one to one).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from archspec.errors import UserError
from archspec.train.build import uses_fsdp
from archspec.train.compile import compile_whole
from archspec.train.distributed import wrap_ddp
from archspec.train.parallel import apply_activation_checkpointing, shard_data_parallel, shard_fsdp, split_model
from archspec.train.pipeline import Pipeline, held_blocks


@dataclass
class Parallelized:
    """A model made ready for its layout."""

    model: nn.Module  # the generated model (cut, split, sharded in place)
    wrapped: nn.Module  # what a training forward calls: DDP's wrapper, or the model itself
    compile_mode: str
    mesh: Any = None  # archspec.train.mesh.JobMesh, None for pure data parallelism or one process
    pipeline: Pipeline | None = None
    checkpointed: list[int] = field(default_factory=list)  # blocks whose activations are recomputed
    fsdp: bool = False  # FSDP2 shards the data-parallel axis
    steps: list[str] = field(default_factory=list)  # what was applied, in order

    @property
    def compiled(self) -> bool:
        return self.compile_mode != "none"

    @property
    def sharded(self) -> bool:
        """Parameters held as DTensors (FSDP, or any split of the model): checkpoints are DCP's sharded state."""
        return self.fsdp or self.mesh is not None

    def loss_context(self):
        """The context a forward and its backward run in: under tensor parallelism the logits stay sharded by
        vocabulary and the cross-entropy is computed on the shards (loss_parallel); elsewhere nothing."""
        if self.mesh is not None and self.mesh.layout.tp > 1:
            from archspec.train.tensor_parallel import loss_context

            return loss_context(self.model)
        return nullcontext()

    def replica_sum(self, world):
        """A function summing a tensor element-wise over the data-parallel replicas, in place: every process
        without a mesh; over mesh.dp with one (the processes of a tensor-parallel group hold the same tokens'
        statistics: counted once). The model's after-optimizer-step hook takes it."""
        def total(tensor: torch.Tensor) -> torch.Tensor:
            if self.mesh is None:
                return world.all_sum(tensor)
            if self.mesh.layout.dp > 1:
                torch.distributed.all_reduce(tensor, group=self.mesh.dp.get_group())
            return tensor

        return total

    def describe(self) -> str:
        return "parallelize: " + " → ".join(self.steps or ["nothing (one process, eager)"])  # (rich: no markup)


def parallelize(model: nn.Module, build, mesh, *, world, precision, compile_mode: str,
                device: torch.device) -> Parallelized:
    """Apply the job's layout to `model` in the module's fixed order. `precision` (archspec.train.precision.Precision)
    gives the FSDP mixed-precision policy; `compile_mode` is the resolved train.compile."""
    spec = build.spec
    out = Parallelized(model, model, compile_mode, mesh=mesh, fsdp=uses_fsdp(build, world))
    if mesh is not None and mesh.layout.pp > 1:
        _cut_pipeline(out, build, device)
    if mesh is not None:
        split_model(model, spec, mesh)
        out.steps += [f"{axis} {size}" for axis, size in (("tp", mesh.layout.tp), ("ep", mesh.layout.ep)) if size > 1]
    _checkpoint_and_compile(out, spec)
    _shard(out, world, spec.train.parallel, precision, device)
    if out.pipeline is not None:
        out.pipeline.build_schedule()
        par = spec.train.parallel
        out.steps.append(f"pipeline schedule {par.schedule} × {out.pipeline.microbatches} micro-batches")
    return out


def _cut_pipeline(out: Parallelized, build, device: torch.device) -> None:
    spec = build.spec
    if callable(getattr(build.data, "scorer", None)):
        raise UserError("train.data.corpus: a capability task is scored on the logits, which pipeline "
                        "parallelism holds on the last stage only: not built; use train.parallel.pp 1")
    out.pipeline = Pipeline.build(out.model, spec, out.mesh, device)
    held = [i for i, _ in held_blocks(out.model)]
    out.steps.append(f"pipeline cut pp {out.mesh.layout.pp} (layers {held[0]}-{held[-1]} here)" if held
                     else f"pipeline cut pp {out.mesh.layout.pp}")


def _checkpoint_and_compile(out: Parallelized, spec) -> None:
    """Across a mesh each block's forward is compiled inside its checkpoint (torch 2.13 cannot trace a checkpoint
    whose saved values include a DeviceMesh); elsewhere the checkpoint is traced into the block's graph, and per_block
    compiles each block before fully_shard (torchtitan's order). whole / cudagraphs: the whole model, after sharding
    under FSDP (its hooks must be in place), else here."""
    model, mode = out.model, out.compile_mode
    inside = out.compiled and out.mesh is not None
    if inside:
        compile_blocks(model, forward_only=True)
    out.checkpointed = apply_activation_checkpointing(model, spec.train.activation_checkpointing)
    if out.checkpointed:
        out.steps.append(f"activation checkpointing {len(out.checkpointed)}/{len(model.blocks)} blocks")
    if out.compiled and not inside:
        if mode == "per_block":
            compile_blocks(model)
        elif not out.fsdp:
            compile_whole(model, mode)
    if out.compiled:
        out.steps.append(f"compile {mode}")


def _shard(out: Parallelized, world, parallel, precision, device: torch.device) -> None:
    model, mesh = out.model, out.mesh
    if mesh is not None:
        out.wrapped = shard_data_parallel(model, mesh, parallel, device, precision.fsdp_policy())
        if mesh.layout.dp > 1:
            precision.parameters_replace_autocast()  # FSDP's (and replicate's) bf16 parameters replace autocast
            out.steps.append(f"{'fsdp' if parallel.kind == 'fsdp' else 'replicate'} dp {mesh.layout.dp}")
    elif out.fsdp:
        out.wrapped = shard_fsdp(model, world, parallel, precision.fsdp_policy())
        precision.parameters_replace_autocast()  # FSDP's bf16 parameters replace autocast
        out.steps.append(f"fsdp dp {world.size}")
        if out.compile_mode in ("whole", "cudagraphs"):  # after fully_shard, as torchtitan does
            compile_whole(model, out.compile_mode)
    else:
        out.wrapped = wrap_ddp(model, world)
        if world.distributed:
            out.steps.append(f"ddp dp {world.size}")


def compile_blocks(model: nn.Module, forward_only: bool = False) -> None:
    """Compile each block (identical code and shapes, so one graph serves all: compile time does not grow with
    depth) and, when the model splits it out as `head(x, targets)`, the output head (final norm → logits → loss;
    eager, its log-softmax over a large vocabulary costs ~10% of a small model's step). `forward_only` (across a
    mesh): each block's forward method, so activation checkpointing can wrap the compiled forward; the head stays
    eager there (under tp its loss runs in loss_parallel, a context the graph would not see)."""
    for _, block in held_blocks(model):
        if forward_only:
            block.forward = torch.compile(block.forward)  # instance attribute: __call__ finds it
        else:
            block.compile()
    if callable(getattr(type(model), "head", None)) and not forward_only:
        model.head = torch.compile(model.head)  # instance attribute: forward's self.head finds it
