"""The job's layout on a device mesh: pipeline × data × tensor parallel, with expert parallel inside data parallel.

    layout = Layout.of(spec.train.parallel, world_size=8)   # tp=2, ep=2 → dp 4: Layout(dp=4, tp=2, ep=2, pp=1)
    mesh = JobMesh.build(world, layout)                       # DeviceMesh ("pp", "dp_out", "ep", "tp"), "dp" flattened
    mesh.tp, mesh.dp, mesh.ep, mesh.dp_out                    # the sub-meshes each parallelism works over

Ranks are laid out tp innermost (the processes of one tensor-parallel group are neighbours: on one node, over its
fastest links), then ep, then the rest of data parallel, then pp outermost, as torchtitan does. Expert parallelism
borrows from data parallelism: the ep processes of an expert group train on different data and send each token to the
process holding its expert, so dp = dp_out · ep and a non-expert weight is replicated (or FSDP-sharded) over all dp,
an expert weight replicated over dp_out only (left out of FSDP: its gradient is summed over dp_out by its own hook).

`Layout.of` is torch-free and checks the sizes against the world before any process-group work; the model's own
divisibility (heads, FFN hidden, experts by tp or ep) is the spec's rule (archspec.spec.rules), checked at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from archspec.errors import UserError
from archspec.spec.parallel_plan import divisors


@dataclass(frozen=True)
class Layout:
    """How `world` processes split: pp pipeline stages × dp data-parallel replicas × tp tensor-parallel shards; ep of
    the dp replicas share one set of experts."""

    world: int = 1
    dp: int = 1
    tp: int = 1
    ep: int = 1
    pp: int = 1

    @classmethod
    def of(cls, parallel: Any, world_size: int) -> Layout:
        """The layout `train.parallel` asks for on `world_size` processes; UserError naming the field when it cannot
        be laid out (tp · pp must divide the world, ep must divide the data-parallel size)."""
        tp, ep, pp = (int(getattr(parallel, k, 1)) for k in ("tp", "ep", "pp"))
        if world_size % pp:
            raise UserError(f"train.parallel.pp: must divide the number of processes ({world_size}), got {pp}; with "
                            f"{world_size} processes pp can be one of {', '.join(map(str, divisors(world_size)))}, or "
                            f"launch a multiple of {pp} processes")
        if world_size % (tp * pp):
            fits = divisors(world_size // pp)
            raise UserError(f"train.parallel.tp: tp · pp ({tp} · {pp}) must divide the number of processes "
                            f"({world_size}); with {world_size} processes and pp {pp} tp can be one of "
                            f"{', '.join(map(str, fits))}, or launch a multiple of {tp * pp} processes")
        dp = world_size // (tp * pp)
        if dp % ep:
            raise UserError(f"train.parallel.ep: must divide the data-parallel size ({dp} = {world_size} processes / "
                            f"(tp {tp} · pp {pp})): expert parallelism spreads the experts over data-parallel "
                            f"processes; ep can be one of {', '.join(map(str, divisors(dp)))}")
        return cls(world=world_size, dp=dp, tp=tp, ep=ep, pp=pp)

    @property
    def dp_out(self) -> int:
        """Data-parallel replicas of one expert group (what an expert weight is replicated or sharded over)."""
        return self.dp // self.ep

    @property
    def trivial(self) -> bool:
        """Pure data parallelism (or one process): no mesh dimension but dp is larger than one."""
        return self.tp == self.ep == self.pp == 1

    def describe(self) -> str:
        parts = [f"dp {self.dp}"] + [f"{k} {v}" for k, v in (("tp", self.tp), ("ep", self.ep), ("pp", self.pp))
                                     if v > 1]
        return " × ".join(parts) + f" on {self.world} process{'es' if self.world != 1 else ''}"

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's place on each axis (tp innermost, then ep, dp_out, pp): which data it reads (dp), which heads
        and hidden units it holds (tp), which experts (ep)."""
        tp = rank % self.tp
        ep = (rank // self.tp) % self.ep
        dp_out = (rank // (self.tp * self.ep)) % self.dp_out
        pp = rank // (self.tp * self.dp)
        return {"pp": pp, "dp": dp_out * self.ep + ep, "dp_out": dp_out, "ep": ep, "tp": tp}


@dataclass
class JobMesh:
    """The DeviceMesh of a job and its named sub-meshes (None for an axis of size one)."""

    layout: Layout
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh over ("pp", "dp_out", "ep", "tp")
    dp: Any  # its ("dp_out", "ep") dimensions flattened: every data-parallel process (FSDP or replication of the
    # non-expert weights; the data split)

    @classmethod
    def build(cls, device_type: str, layout: Layout) -> JobMesh:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device_type, (layout.pp, layout.dp_out, layout.ep, layout.tp),
                                mesh_dim_names=("pp", "dp_out", "ep", "tp"))
        return cls(layout, mesh, mesh["dp_out", "ep"]._flatten("dp"))

    @property
    def tp(self):
        return self.mesh["tp"]

    @property
    def pp(self):
        """The pipeline's processes: this process's peers at the same data- and tensor-parallel place, one a stage."""
        return self.mesh["pp"]

    @property
    def ep(self):
        return self.mesh["ep"]

    @property
    def dp_out(self):
        """The data-parallel processes that hold the same experts (FSDP or replication of the expert weights)."""
        return self.mesh["dp_out"]
