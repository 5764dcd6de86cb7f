"""Expert parallelism for the MoE layers of a generated model, on the job's device mesh (archspec.train.mesh).

Under `train.parallel.ep` = N each MoE layer keeps n_experts / N of its routed experts on each process of an ep group
(its stacked expert weights become DTensors sharded on dim 0, the expert index, over `mesh.ep`: parameter names and
global shapes are what one process has, so a DCP checkpoint saved under ep=2 loads under ep=1 and the HF export sees
the same tensors). The ep processes train on different data: each token goes to the process holding its expert and
back (archspec.runtime.experts.ExpertParallel: all_to_all_single of the per-expert counts, then of the rows, uneven
and differentiable), and the router's statistics (f_i, P_i of the balancing loss, the z-loss mean, the load rows the
loop logs) are summed over every data-parallel process (`mesh.dp`) by an autograd-aware all-reduce, so N processes
give the single-process losses of the same global batch.

Gradients. A non-expert weight is replicated over `mesh.dp` (every data-parallel process): averaged over dp as
usual. An expert weight lives on one process of each ep group and is replicated over `mesh.dp_out` only; its
gradient on that process already sums the contributions of every token of the ep group (the all-to-all's backward
brings them home), so the data-parallel reduction of an expert weight is a SUM over `mesh.dp_out` divided by the
whole data-parallel size dp (= dp_out · ep), not by dp_out: `shard_experts` sets exactly that (a gradient hook doing the all-reduce over dp_out and the division, with the experts left out of DDP or FSDP2).

The loop's order: build the model (same seed on every rank) → `apply_moe_parallel(block.ffn, mesh)` for every MoE
layer (`parallelize_moe(model, mesh)` does them all) → activation checkpointing / compile → `ignored = shard_experts(model,
mesh, fsdp)` → FSDP2 (`fully_shard(..., ignored_params=ignored)`) or replication of the rest over `mesh.dp`
(archspec.train.parallel.shard_data_parallel) → the optimizer (archspec.train.optim.separate_dtensors) →
archspec.train.parallel.clip_gradients for the gradient norm (the expert gradients are DTensors on another mesh).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from archspec.errors import UserError
from archspec.runtime.experts import ExpertParallel, local_tensor


def moe_layers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(block index, FFN module) of each MoE layer of a generated model: the FFNs with routed experts."""
    return [(i, block.ffn) for i, block in enumerate(getattr(model, "blocks", ()))
            if hasattr(block.ffn, "experts") and hasattr(block.ffn, "parallel")]


def _grouped_in_use(module: nn.Module, compute_dtype: torch.dtype | None) -> None:
    from archspec.runtime.grouped_gemm import grouped_mm_usable

    device = module.experts.up_proj.device
    dtype = compute_dtype or module.experts.up_proj.dtype
    if device.type != "meta" and not grouped_mm_usable(device, dtype):
        raise UserError(f"train.parallel.ep: expert parallelism runs the experts through the grouped GEMM, which "
                        f"{device.type} in {str(dtype).removeprefix('torch.')} lacks here (CPU fp32/bf16, CUDA "
                        "bf16 on Hopper); set ep: 1")


def apply_moe_parallel(module: nn.Module, mesh, compute_dtype: torch.dtype | None = None) -> nn.Module:
    """Make one generated MoE FFN (`block.ffn`) work on `mesh` (an archspec.train.mesh.JobMesh), in place: under ep
    its experts become DTensors sharded by expert over mesh.ep and its rows are dispatched to their experts'
    processes; under tp its experts (and shared experts) are split by hidden over mesh.tp, and the module takes
    this process's sequence shard (B, T/tp, D) and returns the same shard of its output, summed over tp; with more
    than one data-parallel process its router statistics are summed over mesh.dp. Without tp the module keeps
    taking and returning this process's (B, T, D) tokens. `compute_dtype`: the experts' matmul dtype (autocast's),
    checked against the grouped GEMM. Returns the module."""
    from torch.distributed.tensor import Shard, distribute_tensor

    layout = mesh.layout
    if layout.tp > 1 and layout.ep > 1:
        raise UserError(f"train.parallel.ep: expert parallelism together with tensor parallelism (tp {layout.tp}) is "
                        "not built yet; set ep: 1 (the MoE layer is then split by hidden over tp) or tp: 1")
    if layout.tp > 1:
        _split_by_hidden(module, mesh.tp)
    if layout.ep > 1:
        n_experts = module.experts.up_proj.shape[0]
        if n_experts % layout.ep:
            raise UserError(f"train.parallel.ep: must divide the MoE layer's {n_experts} experts, got {layout.ep}")
        _grouped_in_use(module, compute_dtype)
        for name, p in list(module.experts.named_parameters(recurse=False)):
            # rank 0's values, each process keeping the experts it holds (the same expert index range for each
            # parameter: process p of the ep group holds experts p·E/ep ... (p+1)·E/ep − 1)
            sharded = nn.Parameter(distribute_tensor(p.detach(), mesh.ep, [Shard(0)]), requires_grad=p.requires_grad)
            module.experts.register_parameter(name, sharded)
    ep_group = mesh.ep.get_group() if layout.ep > 1 else None
    stats_group = mesh.dp.get_group() if layout.dp > 1 else None
    tp_group = mesh.tp.get_group() if layout.tp > 1 else None
    if ep_group is not None or stats_group is not None or tp_group is not None:
        module.parallel = ExpertParallel(ep_group, stats_group, tp_group)
    return module


def _local_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, local_tensor(linear.weight), None if linear.bias is None else local_tensor(linear.bias))


def _split_by_hidden(module: nn.Module, tp_mesh) -> None:
    """Tensor parallelism of one MoE layer: every expert's hidden units split over tp (gate/up by their output rows,
    down by its input columns; DTensors, so names and global shapes stay), the shared expert likewise (colwise
    gate/up, rowwise down), the router and the shared gate whole on every process. Biases would be added once per
    process on the rowwise side: refused (the spec rule says so first)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    tp = tp_mesh.size()
    biased = [n for n, _ in module.experts.named_parameters(recurse=False) if n.endswith("_bias")]
    if biased:
        raise UserError(f"train.parallel.tp: an MoE layer whose experts have biases ({', '.join(biased)}) is not "
                        "split by tensor parallelism; set the expert's bias: false, or tp: 1")
    experts = module.experts
    for name in ("gate_proj", "up_proj", "down_proj"):
        p = getattr(experts, name, None)
        if p is None:
            continue
        dim = 2 if name == "down_proj" else 1  # (E, hidden, D) by hidden rows; down (E, D, hidden) by hidden columns
        if p.shape[dim] % tp:
            raise UserError(f"train.parallel.tp: must divide the experts' hidden size ({p.shape[dim]}), got {tp}")
        experts.register_parameter(name, nn.Parameter(distribute_tensor(p.detach(), tp_mesh, [Shard(dim)]),
                                                      requires_grad=p.requires_grad))
    shared = getattr(module, "shared_expert", None)
    if shared is not None:
        for name in ("gate_proj", "up_proj", "down_proj"):
            linear = getattr(shared, name, None)
            if linear is None:
                continue
            dim = 1 if name == "down_proj" else 0  # nn.Linear weights are (out, in)
            if linear.weight.shape[dim] % tp:
                raise UserError(f"train.parallel.tp: must divide the shared experts' hidden size "
                                f"({linear.weight.shape[dim]}), got {tp}")
            linear.weight = nn.Parameter(distribute_tensor(linear.weight.detach(), tp_mesh, [Shard(dim)]))
            linear.forward = functools.partial(_local_linear, linear)


def parallelize_moe(model: nn.Module, mesh, compute_dtype: torch.dtype | None = None) -> list[int]:
    """`apply_moe_parallel` on every MoE layer of `model`; returns their block indices."""
    layers = moe_layers(model)
    for _, ffn in layers:
        apply_moe_parallel(ffn, mesh, compute_dtype)
    return [i for i, _ in layers]


def expert_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every routed-expert weight held by expert parallelism (DTensors on the ep mesh)."""
    out = []
    for i, ffn in moe_layers(model):
        if getattr(ffn.parallel, "ep", 1) > 1:
            out += [(f"blocks.{i}.ffn.experts.{n}", p) for n, p in ffn.experts.named_parameters(recurse=False)]
    return out


def shard_experts(model: nn.Module, mesh, fsdp: bool) -> set[nn.Parameter]:
    """The data-parallel side of the expert weights (call after `apply_moe_parallel`, before FSDP2 or DDP of the
    rest over mesh.dp). An expert weight's gradient must be summed over mesh.dp_out and divided by the whole
    data-parallel size dp: a gradient hook on each expert weight does exactly that (an all-reduce over dp_out when
    it has more than one process, then the division), once per backward, so it is right under gradient
    accumulation too. The experts are left out of the data-parallel wrapper of the rest: under ddp they are set as
    DDP's parameters to ignore; under fsdp pass the returned set as `ignored_params` to every `fully_shard` over
    mesh.dp. Returns the expert weights (empty without expert parallelism).

    Under fsdp the expert weights are sharded by expert over ep and replicated over dp_out (dp_out = dp / ep is 1
    when ep spans the data-parallel processes): FSDP2 reduces a unit's gradients in the hooks of that unit's
    forward, and the experts' stacked weights are read inside the MoE layer's forward, never through a forward of
    their own."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    layout = mesh.layout
    experts = expert_parameters(model)
    if not experts:
        return set()
    group = mesh.dp_out.get_group() if layout.dp_out > 1 else None

    def reduce(grad: torch.Tensor) -> torch.Tensor:
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        if group is not None:
            dist.all_reduce(local, group=group)
        local.div_(layout.dp)
        return grad

    for _, p in experts:
        p.register_hook(reduce)
    if not fsdp:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in experts])
    return {p for _, p in experts}
