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

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a DTensor (its experts, or its hidden slice); a plain tensor unchanged."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


class MoEParallel:
    """One process: the experts are all here and the batch is the whole batch."""

    def dispatch(self, xs: torch.Tensor, counts: torch.Tensor, experts) -> torch.Tensor:
        """xs (M, D) rows sorted by expert, counts (n_experts,) rows per expert; `experts(rows, counts)` runs rows
        sorted by expert through the experts this process holds → (M, D) each row's output, in xs's order."""
        return experts(xs, counts)

    def batch_sum(self, sums: torch.Tensor) -> torch.Tensor:
        """Per-batch sums → their total over every data-parallel process (differentiable)."""
        return sums


ONE_PROCESS = MoEParallel()


class ExpertParallel(MoEParallel):
    """n_experts / ep experts on each of the ep processes of `ep_group` (None: every expert here); the router's sums
    over `stats_group` (every data-parallel process; None: this process's batch only)."""

    def __init__(self, ep_group=None, stats_group=None) -> None:
        import torch.distributed as dist

        self.ep_group = ep_group
        self.ep = dist.get_world_size(ep_group) if ep_group is not None else 1
        self.stats_group = stats_group
        # (rows sent to each process, rows received from each) of the last dispatch: what the uneven exchange moved
        self.last_splits: tuple[list[int], list[int]] | None = None

    def dispatch(self, xs: torch.Tensor, counts: torch.Tensor, experts) -> torch.Tensor:
        import torch.distributed as dist
        from torch.distributed.nn.functional import all_to_all_single

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
        rows = all_to_all_single(xs.new_empty(sum(recv_splits), xs.shape[1]), xs.contiguous(), recv_splits,
                                 send_splits, group=self.ep_group)  # (R, D) rows for this process's experts
        ys = experts(rows.index_select(0, by_expert), recv.sum(dim=0))  # (R, D) sorted by local expert
        ys = ys.index_select(0, back)  # (R, D) in arrival order again
        return all_to_all_single(xs.new_empty(xs.shape[0], ys.shape[1]), ys.contiguous(), send_splits, recv_splits,
                                 group=self.ep_group)  # (M, D) each row's output, home again

    def batch_sum(self, sums: torch.Tensor) -> torch.Tensor:
        if self.stats_group is None:
            return sums
        from torch.distributed.nn.functional import all_reduce

        # backward: the gradients all-reduced too, which is right when the loop averages gradients over the same
        # processes (each process's loss holds the global balancing loss once)
        return all_reduce(sums, group=self.stats_group)
