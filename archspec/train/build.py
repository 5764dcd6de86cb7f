"""A run's build: everything derived from its spec before the first step, made once by `prepare` and passed down —
the sweep runner checks data, run ids and memory with it, the loop trains from it, the registry records it.

    build = prepare(spec, build_data(spec, cache))
    build.model_hash, build.accounting.flops_train, build.experiment_id, build.memory.total

The run key is `archspec.train.logger.run_key` over (model hash, the recipe as run, data hash, seed); the recipe as
run is `run_recipe`: the spec's train section plus what else changes what is learned (other starting weights, the
number of processes). Nothing else derives a run's id.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from archspec.accounting import Accounting, account
from archspec.kinds.base import identity_dump
from archspec.memory import MemoryPlan, check_memory
from archspec.spec import Spec, model_hash
from archspec.recipe import RecipeView
from archspec.train.data import TrainData
from archspec.train.logger import run_key


def run_recipe(spec: Spec, *, world_size: int = 1, init_digest: str | None = None) -> dict[str, Any]:
    """The recipe as run. With more than one data-parallel replica it includes their number, `data_parallel`
    (processes / (tp · pp), archspec.train.mesh.Layout): N replicas see N× the sequences per step, a different
    experiment, so a different run id; processes that split the model (tp, pp) change how it is computed, not what is
    learned, so tp=2 on 2 processes has one process's id. Other starting weights are another experiment too, named by
    their digest. The parallel strategy and activation checkpointing are stored with it but are not part of the run id
    (run_key)."""
    recipe = identity_dump(spec.train)
    if init_digest is not None:
        recipe["init_from"] = init_digest
    dp = data_parallel_size(spec, world_size)
    if dp > 1:
        recipe["data_parallel"] = dp
    return recipe


def data_parallel_size(spec: Spec, world_size: int) -> int:
    """Data-parallel replicas of `spec` on `world_size` processes (UserError when train.parallel cannot be laid out)."""
    from archspec.train.mesh import Layout

    return Layout.of(spec.train.parallel, world_size).dp


def uses_fsdp(build, world) -> bool:
    """Whether FSDP2 shards a run: kind fsdp over more than one data-parallel replica (tp=2 on two processes has one
    replica: nothing to shard over)."""
    return world.distributed and build.spec.train.parallel.kind == "fsdp" and build.view.data_parallel > 1


@dataclass(frozen=True)
class Build:
    """One run's derived facts, computed once."""

    spec: Spec
    model_hash: str
    accounting: Accounting  # at the run's train.seq_len: its FLOPs per token and KV bytes
    spec_accounting: Accounting  # at model.context_length: the spec's own row in the registry
    data: TrainData
    recipe: dict[str, Any]  # run_recipe: the recipe as run
    world_size: int
    experiment_id: str  # run_key(model hash, recipe, data hash, seed)
    memory: MemoryPlan | None = None  # checked for `device` (None until `checked`)
    device: str | None = None

    @property
    def view(self) -> RecipeView:
        """The recipe's derived quantities on this build's processes (tokens per step, global batch, precision,
        compile mode): archspec.recipe, their one owner."""
        return RecipeView.of(self.spec.train, data_parallel_size(self.spec, self.world_size))

    def checked(self, device: str) -> Build:
        """This build with its memory plan checked for `device` (cpu | cuda; UserError when it cannot fit). A plan
        already checked for the device is kept: the sweep runner checks every variant before anything trains."""
        if self.memory is not None and self.device == device:
            return self
        plan = check_memory(self.spec, for_training=True, device=device, world_size=self.world_size,
                            accounting=self.spec_accounting)
        return replace(self, memory=plan, device=device)


def prepare(spec: Spec, data: TrainData, *, world_size: int = 1, init_digest: str | None = None,
            accounting: Accounting | None = None) -> Build:
    """The build of `spec` over its prepared `data` (archspec.train.data.build_data) on `world_size` processes.
    accounting: `account(spec, seq_len=spec.train.seq_len)` when the caller has it (a sweep's variant does)."""
    recipe = run_recipe(spec, world_size=world_size, init_digest=init_digest)
    digest = model_hash(spec)
    return Build(spec=spec, model_hash=digest, accounting=accounting or account(spec, seq_len=spec.train.seq_len),
                 spec_accounting=account(spec), data=data, recipe=recipe, world_size=world_size,
                 experiment_id=run_key(digest, recipe, data.data_hash, spec.train.seed))
