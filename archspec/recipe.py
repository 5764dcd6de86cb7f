"""The recipe's derived quantities, owned here once (this module imports nothing, so any layer may read it): tokens per step, the global batch, the precision's element sizes
and the compile mode. The loop, the sweep runner, the estimates, the memory plan, the UI and the reports all read
them from a `RecipeView`, so they cannot mean different things in different places.

    view = RecipeView.of(spec.train, data_parallel=2)   # a run about to train (archspec.train.build.Build.view)
    view = RecipeView.stored(run.recipe)                # a recorded run (the registry's recipe as run)
    view.tokens_per_step, view.global_batch, view.sixteen_bit("cuda"), view.compile

Tokens per step are the tokens one optimizer step trains on over every data-parallel replica:
batch_size × grad_accum × seq_len × data_parallel. Processes that split the model (tp, pp, ep) do not multiply it: they
share their replica's tokens. `data_parallel` is the replicas' count (archspec.train.mesh.Layout.dp, recorded as the
recipe's `data_parallel` when above one), never the world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

SIXTEEN_BIT = ("bf16", "fp16", "fp8")  # 16-bit matmuls: fp8's float8 linears run inside bf16 autocast


@dataclass(frozen=True)
class RecipeView:
    """What a recipe (train:) implies once its processes are counted."""

    batch_size: int  # sequences per replica per micro-step
    grad_accum: int  # micro-steps per optimizer step
    seq_len: int  # tokens per sequence
    data_parallel: int = 1  # replicas that read their own batches
    precision: str = "auto"
    compile: str = "none"

    @classmethod
    def of(cls, train: Any, data_parallel: int = 1) -> RecipeView:
        """The view of a TrainSpec (archspec.spec.train) on `data_parallel` replicas."""
        return cls(batch_size=int(train.batch_size), grad_accum=int(train.grad_accum), seq_len=int(train.seq_len or 0),
                   data_parallel=int(data_parallel), precision=str(train.precision), compile=str(train.compile))

    @classmethod
    def stored(cls, recipe: Mapping[str, Any]) -> RecipeView | None:
        """The view of a recorded recipe as run (archspec.train.build.run_recipe: its `data_parallel` key is there
        when above one); None when the stored recipe lacks a figure (a damaged row)."""
        try:
            return cls(batch_size=int(recipe["batch_size"]), grad_accum=int(recipe["grad_accum"]),
                       seq_len=int(recipe["seq_len"]), data_parallel=int(recipe.get("data_parallel") or 1),
                       precision=str(recipe.get("precision", "auto")), compile=str(recipe.get("compile", "none")))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def sequences_per_replica(self) -> int:
        """Sequences one replica trains on per optimizer step (its micro-batches together)."""
        return self.batch_size * self.grad_accum

    @property
    def global_batch(self) -> int:
        """Sequences one optimizer step trains on, over every replica."""
        return self.sequences_per_replica * self.data_parallel

    @property
    def tokens_per_replica_step(self) -> int:
        """Tokens one replica trains on per optimizer step."""
        return self.sequences_per_replica * self.seq_len

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains on, over every replica."""
        return self.global_batch * self.seq_len

    @property
    def micro_batch_tokens(self) -> int:
        """Tokens of one replica's micro-step (one forward and backward; every pipeline micro-batch of it)."""
        return self.batch_size * self.seq_len

    def sixteen_bit(self, device: str) -> bool:
        """Whether matmuls run in 16 bits on `device` (cpu | cuda): bf16, fp16 and fp8, and `auto` on CUDA."""
        return self.precision in SIXTEEN_BIT or (self.precision == "auto" and device == "cuda")

    def matmul_bytes(self, device: str) -> int:
        """Element size of matmul inputs and outputs (2 under 16-bit autocast, else 4); the residual stream and norm
        statistics stay fp32 (4) in every precision."""
        return 2 if self.sixteen_bit(device) else 4
