"""Where an MoE layer's sorted rows meet their experts, and over which processes its router statistics are summed.

A generated MoE layer holds `self.parallel` and calls it at two points of its forward:

    y_of = self.parallel.dispatch(xs, counts, self._grouped)  # rows sorted by expert → each row's expert output
    totals = self.parallel.batch_sum(sums)                    # the router's sums → over the whole global batch

On one process (`ONE_PROCESS`) both are the identity: the experts run here, the sums are this batch's. Expert
parallelism (`ExpertParallel`, installed by archspec.train.expert_parallel) holds n_experts / ep experts per process:
`dispatch` exchanges the per-expert counts (all_to_all_single), sends each row to the process holding its expert (an
uneven, differentiable all_to_all_single), runs the local experts on their rows (the grouped GEMM) and sends the
outputs back in the order they came; `batch_sum` all-reduces the sums over the data-parallel processes with an
autograd-aware all-reduce, so the balancing loss, the z-loss and the load statistics are those of the global batch.

Expert weights under expert parallelism are DTensors sharded on dim 0 (the expert index) over the ep mesh: names and
global shapes stay what one process has, so checkpoints and exports read the same; `local_tensor` is this process's
slice (the experts it holds), and a plain tensor itself.
"""

from __future__ import annotations

import sys

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a DTensor (its experts, or its hidden slice); a plain tensor unchanged. (No DTensor
    exists before torch.distributed.tensor is imported: one process never imports it here.)"""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(t, dtensor.DTensor):
        return t.to_local()
    return t


class MoEParallel:
    """One process: the experts are all here and the batch is the whole batch."""

    def gather(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) this process's tokens → (the tokens the experts run on, the same tokens for what every
        process computes whole: the router, the shared gate). One process: x, twice."""
        return x, x

    def replicated(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor every process computes whole that multiplies a partial sum (the gates, the shared gate)."""
        return t

    def scatter(self, out: torch.Tensor) -> torch.Tensor:
        """(B, T, D) the layer's output (partial sums under tensor parallelism) → this process's tokens, summed."""
        return out

    def dispatch(self, xs: torch.Tensor, counts: torch.Tensor, experts) -> torch.Tensor:
        """xs (M, D) rows sorted by expert, counts (n_experts,) rows per expert; `experts(rows, counts)` runs rows
        sorted by expert through the experts this process holds → (M, D) each row's output, in xs's order."""
        return experts(xs, counts)

    def batch_sum(self, sums: torch.Tensor) -> torch.Tensor:
        """Per-batch sums → their total over every data-parallel process (differentiable)."""
        return sums


ONE_PROCESS = MoEParallel()


class _GatherTokens(torch.autograd.Function):
    """Sequence shards (B, T/tp, D) → every token (B, T, D), twice: the copy the experts read (each process computes
    part of their output, so its gradient is a partial sum: reduce-scattered back) and the copy the router reads
    (every process computes the router whole, so its gradient is the same on each: this process's slice of it)."""

    @staticmethod
    def forward(ctx, x, group):
        from torch.distributed._functional_collectives import all_gather_single, wait_tensor

        ctx.group = group
        ctx.rank = torch.distributed.get_rank(group)
        ctx.size = torch.distributed.get_world_size(group)
        whole = wait_tensor(all_gather_single(x.contiguous(), 1, group))
        return whole, whole.clone()

    @staticmethod
    def backward(ctx, grad_experts, grad_router):
        from torch.distributed._functional_collectives import reduce_scatter_single, wait_tensor

        grad = wait_tensor(reduce_scatter_single(grad_experts.contiguous(), "sum", 1, ctx.group))
        return grad + grad_router.chunk(ctx.size, dim=1)[ctx.rank], None


class _SumGradients(torch.autograd.Function):
    """Identity forward; backward: the gradient summed over the tensor-parallel processes (each holds a part)."""

    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class ExpertParallel(MoEParallel):
    """An MoE layer on a device mesh: n_experts / ep experts on each of the ep processes of `ep_group` (None: every
    expert here); each expert's hidden units split over the processes of `tp_group` (None: whole), which share
    their tokens; the router's sums over `stats_group` (the data-parallel processes; None: this batch only).

    Tensor parallelism: the layer takes this process's sequence shard, gathers the tp group's tokens, runs the
    router whole on each process (its gradient made whole: the gates' gradient summed over tp) and the experts on
    their hidden slice, and reduce-scatters the partial outputs back to the sequence shard."""

    def __init__(self, ep_group=None, stats_group=None, tp_group=None) -> None:
        import torch.distributed as dist

        self.ep_group = ep_group
        self.ep = dist.get_world_size(ep_group) if ep_group is not None else 1
        self.tp_group = tp_group
        self.stats_group = stats_group
        # (rows sent to each process, rows received from each) of the last dispatch: what the uneven exchange moved
        self.last_splits: tuple[list[int], list[int]] | None = None

    def dispatch(self, xs: torch.Tensor, counts: torch.Tensor, experts) -> torch.Tensor:
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

        if self.ep_group is None:
            return experts(xs, counts)
        n_local = counts.numel() // self.ep  # experts on each process: process p holds experts p·n_local ...
        with torch.no_grad():
            # recv[s, e]: rows process s sends to this process's e-th expert
            recv = torch.empty_like(counts)
            dist.all_to_all_single(recv, counts, group=self.ep_group)
            recv = recv.view(self.ep, n_local)
            send_splits = counts.view(self.ep, n_local).sum(dim=1).tolist()  # rows to each process
            recv_splits = recv.sum(dim=1).tolist()  # rows from each process
            # the received rows come by source process, then by expert: regroup them by expert (a stable sort keeps
            # each expert's rows in source order), and remember how to put the outputs back
            expert_of = torch.arange(n_local, device=xs.device).repeat(self.ep).repeat_interleave(recv.reshape(-1))
            by_expert = expert_of.argsort(stable=True)
            back = by_expert.argsort()
        self.last_splits = (send_splits, recv_splits)
        rows = wait_tensor(all_to_all_single_autograd(xs.contiguous(), recv_splits, send_splits, self.ep_group))
        # rows (R, D): those for this process's experts
        ys = experts(rows.index_select(0, by_expert), recv.sum(dim=0))  # (R, D) sorted by local expert
        ys = ys.index_select(0, back)  # (R, D) in arrival order again
        # (M, D) each row's output, home again
        return wait_tensor(all_to_all_single_autograd(ys.contiguous(), send_splits, recv_splits, self.ep_group))

    def gather(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tp_group is None:
            return x, x
        return _GatherTokens.apply(x, self.tp_group)

    def replicated(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.tp_group is None else _SumGradients.apply(t, self.tp_group)

    def scatter(self, out: torch.Tensor) -> torch.Tensor:
        if self.tp_group is None:
            return out
        from torch.distributed._functional_collectives import reduce_scatter_single_autograd, wait_tensor

        # backward: the all-gather of the shards' gradients (every process's partial output gets the whole gradient)
        return wait_tensor(reduce_scatter_single_autograd(out.contiguous(), "sum", 1, self.tp_group))

    def batch_sum(self, sums: torch.Tensor) -> torch.Tensor:
        if self.stats_group is None:
            return sums
        import warnings

        from torch.distributed.nn.functional import all_reduce  # the one differentiable all-reduce torch has

        # backward: the gradients all-reduced too, which is right when the loop averages gradients over the same
        # processes (each process's loss holds the global balancing loss once)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated for the functional all_reduce, not autograd
            return all_reduce(sums, group=self.stats_group)
