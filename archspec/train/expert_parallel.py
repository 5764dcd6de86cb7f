"""Expert parallelism (and the tensor-parallel split) of the MoE layers of a generated model, applied from outside.

A generated MoE layer is single-device code: `self.experts(xs, counts)` runs rows sorted by expert through the routed
experts, and `self.balance(sums, padding)` turns the batch's router sums into the balancing loss, the z-loss and the
statistics. Parallelism attaches to those two submodules and to the layer's boundary, with forward hooks and
in-place changes of parameters, as torch's parallel styles do; the generated code does not change.

Expert parallelism (`train.parallel.ep` = N): each process of an ep group keeps n_experts / N of a layer's routed
experts (their stacked weights become DTensors sharded on dim 0, the expert index, over `mesh.ep`: names and global
shapes stay what one process has, so a DCP checkpoint saved under ep=2 loads under ep=1 and the HF export sees the
same tensors; the experts module reads its own shard when it reads a weight). The ep processes train on different
data: the experts' forward pre-hook exchanges the per-expert counts (all_to_all_single), sends each row to the
process holding its expert (an uneven, differentiable all_to_all_single) and regroups what arrives by local expert;
its forward hook puts the outputs back in arrival order and sends them home (torchtitan's ExpertParallel does the
same in its style's input and output functions).

Router statistics: with more than one data-parallel process a pre-hook on `losses` all-reduces the sums over
`mesh.dp` (differentiably: the backward all-reduces the gradients too, which is right when the loop averages
gradients over the same processes), so the balancing loss, the z-loss and the loads the loop logs are those of the
global batch and N processes give one process's losses.

Gradients. A non-expert weight is replicated over `mesh.dp` (every data-parallel process): averaged over dp as
usual. An expert weight lives on one process of each ep group and is replicated over `mesh.dp_out` only; its
gradient on that process already sums the contributions of every token of the ep group (the all-to-all's backward
brings them home), so the data-parallel reduction of an expert weight is a SUM over `mesh.dp_out` divided by the
whole data-parallel size dp (= dp_out · ep), not by dp_out: `shard_experts` sets exactly that (a gradient hook doing
the all-reduce over dp_out and the division, with the experts left out of DDP or FSDP2).

Tensor parallelism (`train.parallel.tp`, the MoE unit's plan delegates here): the layer takes this process's
sequence shard (B, T/tp, D); a pre-hook all-gathers the tp group's tokens (its backward reduce-scatters the
gradient), every expert's hidden units are split over `mesh.tp` (and the shared experts', colwise/rowwise), and a
forward hook reduce-scatters the partial outputs back to the sequence shard. What every process computes whole from
the gathered tokens (the router, the shared expert's gate) multiplies partial sums, so the gradient of its output is
summed over tp and that of its input shared out (÷ tp, the layer's reduce-scatter sums it again); the router sums'
gradient, the same on every tp process, is shared out likewise.

The loop's order: build the model (same seed on every rank) → `apply_moe_parallel(block.ffn, mesh)` for every MoE
layer (`parallelize_moe(model, mesh)` does them all) → activation checkpointing / compile → `ignored = shard_experts(model,
mesh, fsdp)` → FSDP2 (`fully_shard(..., ignored_params=ignored)`) or replication of the rest over `mesh.dp`
(archspec.train.parallel.shard_data_parallel) → the optimizer (archspec.train.optim.separate_dtensors) →
archspec.train.parallel.clip_gradients for the gradient norm (the expert gradients are DTensors on another mesh).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from archspec.errors import UserError


def moe_layers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(block index, FFN module) of each MoE layer of a generated model: the FFNs with routed experts."""
    return [(i, block.ffn) for i, block in enumerate(getattr(model, "blocks", ()))
            if isinstance(getattr(block.ffn, "experts", None), nn.Module) and hasattr(block.ffn, "balance")]


@dataclass
class MoELayout:
    """What `apply_moe_parallel` did to one MoE layer (kept on it as `_archspec_moe`)."""

    ep: int = 1
    tp: int = 1
    dp: int = 1
    exchange: "_Exchange | None" = None
    hooks: list = field(default_factory=list)


def last_splits(ffn: nn.Module) -> tuple[list[int], list[int]] | None:
    """(rows sent to each process, rows received from each) of an expert-parallel MoE layer's last exchange."""
    layout = getattr(ffn, "_archspec_moe", None)
    return None if layout is None or layout.exchange is None else layout.exchange.last_splits


# ── a module whose weights are DTensors reads its own shard ────────────────────────────────────────────────────────


class _ReadsLocalShards:
    """Mixed into a generated module's class (as FSDP2 swaps in its own): inside its forward, reading a DTensor
    parameter gives this process's shard as a plain tensor (differentiably), so the module's own code runs on the
    experts (or the hidden slices) this process holds. Outside it (named_parameters(), state_dict(), optimizers,
    FSDP's own reads) the parameters are the DTensors."""

    def forward(self, *args, **kwargs):
        self.__dict__["_reads_local_shards"] = True
        try:
            return super().forward(*args, **kwargs)
        finally:
            self.__dict__["_reads_local_shards"] = False

    def __getattr__(self, name: str):
        from torch.distributed.tensor import DTensor

        value = super().__getattr__(name)
        if self.__dict__.get("_reads_local_shards") and isinstance(value, DTensor):
            return value.to_local()
        return value


def _read_local_shards(module: nn.Module) -> None:
    cls = type(module)
    if not issubclass(cls, _ReadsLocalShards):
        module.__class__ = type(f"Sharded{cls.__name__}", (_ReadsLocalShards, cls), {})


def _distribute(module: nn.Module, name: str, mesh, placement) -> None:
    from torch.distributed.tensor import distribute_tensor

    p = getattr(module, "_parameters")[name]
    module.register_parameter(name, nn.Parameter(distribute_tensor(p.detach(), mesh, [placement]),
                                                 requires_grad=p.requires_grad))


# ── the collectives, each an autograd Function with the backward the layout needs ─────────────────────────────────


class _GatherSequence(torch.autograd.Function):
    """Sequence shards (B, T/tp, D) → the tp group's tokens (B, T, D); backward: the gradients (each process's a partial
    sum) reduce-scattered back to the shard."""

    @staticmethod
    def forward(ctx, x, group):
        from torch.distributed._functional_collectives import all_gather_single, wait_tensor

        ctx.group = group
        return wait_tensor(all_gather_single(x.contiguous(), 1, group))

    @staticmethod
    def backward(ctx, grad):
        from torch.distributed._functional_collectives import reduce_scatter_single, wait_tensor

        return wait_tensor(reduce_scatter_single(grad.contiguous(), "sum", 1, ctx.group)), None


class _SumGradients(torch.autograd.Function):
    """Identity forward; backward: the gradient summed over the group (each process holds a part of it)."""

    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class _ShareGradient(torch.autograd.Function):
    """Identity forward; backward: the gradient ÷ n (the same on each of n processes, whose sum comes later)."""

    @staticmethod
    def forward(ctx, t, n):
        ctx.n = n
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.n, None


class _BatchSum(torch.autograd.Function):
    """Per-batch sums → their total over the data-parallel processes (None: this batch); backward: the gradients
    all-reduced too (each process's loss holds the global balancing loss once, and the loop averages gradients over
    the same processes), then ÷ tp (every tp process computes the same sums from the same tokens)."""

    @staticmethod
    def forward(ctx, sums, group, tp):
        ctx.group, ctx.tp = group, tp
        if group is None:
            return sums.clone()
        total = sums.detach().clone()
        torch.distributed.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        if ctx.group is not None:
            torch.distributed.all_reduce(grad, group=ctx.group)
        return (grad / ctx.tp if ctx.tp > 1 else grad), None, None


# ── expert parallelism: the rows go to their experts' processes and back ──────────────────────────────────────────


class _Exchange:
    """The experts' forward pre-hook and forward hook under expert parallelism (ep processes in `group`)."""

    def __init__(self, group, ep: int) -> None:
        self.group, self.ep = group, ep
        # (rows sent to each process, rows received from each) of the last exchange: what the uneven all-to-all moved
        self.last_splits: tuple[list[int], list[int]] | None = None
        self._back: tuple[list[int], list[int], torch.Tensor] | None = None

    def dispatch(self, module: nn.Module, args: tuple):
        """(xs (M, D) rows sorted by expert, counts (n_experts,), ...) → (the rows for this process's experts, sorted
        by local expert; their counts (n_experts / ep,), ...)."""
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

        xs, counts, *rest = args
        n_local = counts.numel() // self.ep  # process p holds experts p·n_local ... (p+1)·n_local − 1
        with torch.no_grad():
            recv = torch.empty_like(counts)  # recv[s, e]: rows process s sends to this process's e-th expert
            dist.all_to_all_single(recv, counts, group=self.group)
            recv = recv.view(self.ep, n_local)
            send_splits = counts.view(self.ep, n_local).sum(dim=1).tolist()  # rows to each process
            recv_splits = recv.sum(dim=1).tolist()  # rows from each process
            # the rows arrive by source process, then by expert: regrouped by expert (a stable sort keeps each
            # expert's rows in source order), and how to put the outputs back
            expert_of = torch.arange(n_local, device=xs.device).repeat(self.ep).repeat_interleave(recv.reshape(-1))
            by_expert = expert_of.argsort(stable=True)
        self.last_splits = (send_splits, recv_splits)
        self._back = (send_splits, recv_splits, by_expert.argsort())
        rows = wait_tensor(all_to_all_single_autograd(xs.contiguous(), recv_splits, send_splits, self.group))
        return (rows.index_select(0, by_expert), recv.sum(dim=0), *rest)

    def combine(self, module: nn.Module, args: tuple, output):
        """(each received row's output sorted by local expert, padding) → (each of this process's rows' output, in
        the order they were sent, padding)."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

        ys, *rest = output
        send_splits, recv_splits, back = self._back
        self._back = None
        ys = ys.index_select(0, back)  # (R, D) in arrival order again
        home = wait_tensor(all_to_all_single_autograd(ys.contiguous(), send_splits, recv_splits, self.group))
        return (home, *rest)


def _grouped_in_use(module: nn.Module, compute_dtype: torch.dtype | None) -> None:
    from archspec.runtime.grouped_gemm import grouped_mm_usable

    weight = module.experts.up_proj
    device = weight.device
    dtype = compute_dtype or weight.dtype
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
    from torch.distributed.tensor import Shard

    layout = mesh.layout
    if getattr(module, "_archspec_moe", None) is not None:
        return module  # applied already
    if layout.tp > 1 and layout.ep > 1:
        raise UserError(f"train.parallel.ep: expert parallelism together with tensor parallelism (tp {layout.tp}) is "
                        "not built yet; set ep: 1 (the MoE layer is then split by hidden over tp) or tp: 1")
    state = MoELayout(ep=layout.ep, tp=layout.tp, dp=layout.dp)
    if layout.tp > 1:
        _split_by_hidden(module, mesh.tp, state)
    if layout.ep > 1:
        n_experts = module.experts.up_proj.shape[0]
        if n_experts % layout.ep:
            raise UserError(f"train.parallel.ep: must divide the MoE layer's {n_experts} experts, got {layout.ep}")
        _grouped_in_use(module, compute_dtype)
        # rank 0's values, each process keeping the experts it holds (the same expert index range for each
        # parameter: process p of the ep group holds experts p·E/ep ... (p+1)·E/ep − 1)
        for name in list(module.experts._parameters):
            _distribute(module.experts, name, mesh.ep, Shard(0))
        _read_local_shards(module.experts)
        state.exchange = _Exchange(mesh.ep.get_group(), layout.ep)
        state.hooks += [module.experts.register_forward_pre_hook(state.exchange.dispatch),
                        module.experts.register_forward_hook(state.exchange.combine)]
    stats_group = mesh.dp.get_group() if layout.dp > 1 else None
    if stats_group is not None or layout.tp > 1:
        tp = layout.tp

        def batch_sum(_, args):
            sums, *rest = args
            return (_BatchSum.apply(sums, stats_group, tp), *rest)

        state.hooks.append(module.balance.register_forward_pre_hook(batch_sum))
    module._archspec_moe = state
    return module


def _local_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, linear.weight.to_local(), None if linear.bias is None else linear.bias.to_local())


def _split_by_hidden(module: nn.Module, tp_mesh, state: MoELayout) -> None:
    """Tensor parallelism of one MoE layer: every expert's hidden units split over tp (gate/up by their output rows,
    down by its input columns; DTensors, so names and global shapes stay), the shared expert likewise (colwise
    gate/up, rowwise down), the router and the shared gate whole on every process; the layer's boundary gathers the
    sequence and reduce-scatters its output. Biases would be added once per process on the rowwise side: refused
    (the spec rule says so first)."""
    from torch.distributed.tensor import Shard

    tp = tp_mesh.size()
    group = tp_mesh.get_group()
    experts = module.experts
    biased = [n for n in experts._parameters if n.endswith("_bias")]
    if biased:
        raise UserError(f"train.parallel.tp: an MoE layer whose experts have biases ({', '.join(biased)}) is not "
                        "split by tensor parallelism; set the expert's bias: false, or tp: 1")
    for name in ("gate_proj", "up_proj", "down_proj"):
        p = experts._parameters.get(name)
        if p is None:
            continue
        dim = 2 if name == "down_proj" else 1  # (E, hidden, D) by hidden rows; down (E, D, hidden) by hidden columns
        if p.shape[dim] % tp:
            raise UserError(f"train.parallel.tp: must divide the experts' hidden size ({p.shape[dim]}), got {tp}")
        _distribute(experts, name, tp_mesh, Shard(dim))
    _read_local_shards(experts)
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
            _distribute(linear, "weight", tp_mesh, Shard(dim))
            linear.forward = functools.partial(_local_linear, linear)
    # What every process computes whole (the router, the shared gate: the layer's own Linear children) multiplies
    # partial sums: its output's gradient is summed over tp, its input's shared out (the gather's backward sums it).
    for child in module.children():
        if not isinstance(child, nn.Linear):
            continue
        state.hooks += [
            child.register_forward_pre_hook(lambda _, args: (_ShareGradient.apply(args[0], tp), *args[1:])),
            child.register_forward_hook(lambda _, args, out: _SumGradients.apply(out, group)),
        ]

    def gather(_, args):
        return (_GatherSequence.apply(args[0], group), *args[1:])

    def scatter(_, args, out):
        from torch.distributed._functional_collectives import reduce_scatter_single_autograd, wait_tensor

        # backward: the all-gather of the shards' gradients (every process's partial output gets the whole gradient)
        return wait_tensor(reduce_scatter_single_autograd(out.contiguous(), "sum", 1, group))

    state.hooks += [module.register_forward_pre_hook(gather), module.register_forward_hook(scatter)]


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
        if getattr(getattr(ffn, "_archspec_moe", None), "ep", 1) > 1:
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
