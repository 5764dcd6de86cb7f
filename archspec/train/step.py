"""How one batch trains and evaluates, behind one interface whatever the layout: `LocalStep` (one process, DDP, FSDP,
tp/ep) and `PipelineStep` (pp > 1: the batch goes through the pipeline's schedule). The training step
(archspec.train.loop.Trainer.train_step) calls the same four methods on either and never asks which it holds:

    loss, aux = step.batch(inputs, targets, accum, sync)   # forward + backward of one micro-batch (a pipeline: of one
                                                           # replica batch, its micro-batches through the schedule)
                                                           # (media=: a batch's media, for a model with media input)
    loss_sum, aux_sums = step.reduce(loss_sum, aux_sums)   # the pipeline: summed over its stages
    grad_norm = step.clip(max_norm)                        # the global norm over every shard and stage
    logits, loss = step.evaluate(inputs, targets, ...)     # forward only; (None, None) on a stage without the loss

Auxiliary losses and the after-micro-batch hook are the generated model's declared hooks
(archspec.runtime.protocol.TrainingHooks), never attribute names. A batch of a media corpus carries its media
(B, items, tokens, width) as a third tensor; `batch` and `evaluate` take it as `media=` and give it to the model
(`model(inputs, targets, media=media)`); a text batch gives the model nothing more, so a text-only model's call is
what it always was.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from archspec.runtime.protocol import hooks_of
from archspec.train.distributed import full_value, no_sync
from archspec.train.parallel import clip_gradients


def model_inputs(media: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The keyword inputs of the model's forward beside (idx, targets): the batch's media, when it has any."""
    return {} if media is None else {"media": media}


def split_batch(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A batch as (inputs, targets, media or None): a text batch is (inputs, targets), a media batch adds its media."""
    return batch[0], batch[1], (batch[2] if len(batch) > 2 else None)


def mark_step(compile_mode: str) -> None:
    """cudagraphs: a new iteration of the CUDA graph trees before each forward (the previous replay's outputs,
    already read, may be overwritten)."""
    if compile_mode == "cudagraphs":
        torch.compiler.cudagraph_mark_step_begin()


class LocalStep:
    """The whole model (or its tp/ep shards) on every process."""

    def __init__(self, par, precision):
        self.par, self.precision = par, precision  # archspec.train.parallelize.Parallelized, .precision.Precision
        self.model, self.hooks = par.model, hooks_of(par.model)

    def batch(self, inputs: torch.Tensor, targets: torch.Tensor, accum: int, sync: bool,
              media: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One micro-batch: forward, plus the model's auxiliary losses, backward of their sum scaled by 1/accum.
        DDP all-reduces the gradients only when `sync` (the last micro-batch of a step)."""
        with no_sync(self.par.wrapped, sync), self.par.loss_context():
            mark_step(self.par.compile_mode)
            with self.precision.autocast():
                # logits dropped now, not kept through backward
                loss = self.par.wrapped(inputs, targets, **model_inputs(media))[1]
                # under tp a replicated DTensor: its value (differentiably), so the plain auxiliary losses add to it
                loss = full_value(loss)
                aux = self.hooks.auxiliary_losses()
            self.hooks.after_micro_batch()  # state a model keeps over a step's training forwards
            weights = self.hooks.auxiliary_weights()  # multi-token prediction: λ / depth; otherwise 1
            total = loss + sum(weights.get(name, 1.0) * value for name, value in aux.items()) if aux else loss
            self.precision.backward(total / accum)
        return (loss.detach().float(),
                {name: full_value(v.detach()).float().reshape(()) for name, v in aux.items()})

    def reduce(self, loss_sum: torch.Tensor, aux_sums: dict[str, torch.Tensor]
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return loss_sum, aux_sums

    def clip(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.par.mesh is not None:  # gradients on several meshes (tp, dp, ep): one global norm over them all
            return clip_gradients(params, max_norm)
        if max_norm > 0:  # under FSDP the norm is over every shard (a DTensor): its full value counts
            return full_value(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return full_value(torch.nn.utils.get_total_norm([p.grad for p in params]))

    def warm_up(self, dummy: torch.Tensor) -> None:
        """A forward and backward on a dummy batch: the compiled graphs built (two tensors: a graph guards on
        `idx is targets`)."""
        with self.par.loss_context():
            with self.precision.autocast():
                loss = self.model(dummy, dummy.clone())[1]
            full_value(loss).backward()

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor, through_graph: bool, recording=nullcontext,
                 media: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Forward only: (logits, loss), detached (under tp the loss a replicated DTensor's value; the logits stay
        sharded by vocabulary). `through_graph`: with grad enabled, through the training's compiled graphs."""
        with (torch.enable_grad() if through_graph else torch.compiler.set_stance("force_eager")):
            with self.precision.autocast(), recording(), self.par.loss_context():
                logits, loss = self.model(inputs, targets, **model_inputs(media))
        return logits.detach(), full_value(loss.detach())


class PipelineStep:
    """This process's pipeline stages (archspec.train.pipeline.Pipeline)."""

    def __init__(self, par, precision):
        self.par, self.precision, self.pipeline = par, precision, par.pipeline
        self.model = par.model

    def batch(self, inputs: torch.Tensor, targets: torch.Tensor, accum: int, sync: bool,
              media: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One replica batch through the pipeline's schedule (its micro-batches' forwards and backwards); every stage
        draws the batch, so every stage's data position stays the same. The stages count their micro-batches."""
        _no_media(media)
        mark_step(self.par.compile_mode)
        with self.precision.autocast():
            return self.pipeline.train_batch(inputs, targets, accum, self.par.loss_context)

    def reduce(self, loss_sum: torch.Tensor, aux_sums: dict[str, torch.Tensor]
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A tied weight's two parts summed; the loss lives on the last stage and each stage holds its share of the
        auxiliary losses: both summed over the stages."""
        self.pipeline.after_backward()
        stacked = self.pipeline.pipeline_sum(torch.stack([loss_sum, *aux_sums.values()]))
        return stacked[0], dict(zip(aux_sums, stacked[1:]))

    def clip(self, max_norm: float) -> torch.Tensor:
        """Over every stage; a weight two stages hold (tied) counted on the first only."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        skip = {id(p) for p in self.pipeline.tied} if not self.pipeline.first else set()
        return clip_gradients(params, max_norm, counted=[p for p in params if id(p) not in skip],
                              stage_sum=self.pipeline.pipeline_sum)

    def warm_up(self, dummy: torch.Tensor) -> None:
        """Every stage's graphs, through the schedule."""
        with self.precision.autocast():
            self.pipeline.train_batch(dummy, dummy.clone(), 1, self.par.loss_context)

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor, through_graph: bool, recording=nullcontext,
                 media: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Stage to stage; the loss on the last stage only (no logits: a capability task is refused under pp)."""
        _no_media(media)
        with self.precision.autocast():
            loss = self.pipeline.eval_batch(inputs, targets, self.par.loss_context)
        return None, loss


def _no_media(media: torch.Tensor | None) -> None:
    if media is not None:  # the spec's rules refuse pp > 1 with model.media before any process starts
        raise ValueError("a pipeline does not carry media: a model with media input is not split into stages")


def step_for(par, precision) -> LocalStep | PipelineStep:
    """The step of a parallelized model (archspec.train.parallelize)."""
    return (PipelineStep if par.pipeline is not None else LocalStep)(par, precision)


def warm_up(step, recipe, device: torch.device) -> float:
    """Build the compiled graphs now, with a forward and backward on a dummy batch (every rank), so compile time is
    reported on its own and the first step is a real step; returns the seconds it took. The RNG is forked so that
    compiling leaves the training random stream untouched."""
    t0 = time.perf_counter()
    dummy = torch.zeros(recipe.batch_size, recipe.seq_len, dtype=torch.long, device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        mark_step(step.par.compile_mode)
        step.warm_up(dummy)
    step.model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0
