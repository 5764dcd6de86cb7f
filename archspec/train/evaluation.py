"""The loop's evaluation: the mean loss over the fixed validation windows (every window holds seq_len targets, so the
mean of window means is the token mean), its perplexity, the capability task's exact match, the kinds' statistics and
the stability probe's per-layer figures. The layout's step (archspec.train.step) runs each batch.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from archspec.train.metrics import STABILITY_PREFIX, KindStats
from archspec.train.step import split_batch


def graphed_eval(par, spec) -> bool:
    """Whether evaluation runs through the training's compiled graphs. A compiled forward guards on grad mode and on
    each module's `training` flag: under no_grad, or after model.eval(), it compiles again (measured on CPU: an
    inference graph per evaluation mode). So evaluation keeps grad enabled (no backward: the graph's saved tensors are
    freed with the loss) and train mode, which differ from eval mode only in dropout: only without dropout. Not under
    FSDP (a forward without backward leaves its unit states half-way; not tried), across a mesh (FSDP's machinery
    replicates or shards over dp, and tp's styles; not tried) nor cudagraphs (a forward-only replay leaves the graph
    tree a pending backward; not measured without a device): those evaluate eager, as does a ragged last batch
    (another shape would be another graph)."""
    return (par.compiled and par.compile_mode != "cudagraphs" and spec.model.dropout == 0 and not par.fsdp
            and par.mesh is None)


@torch.no_grad()
def evaluate(trainer) -> dict[str, float]:
    """The metrics of one evaluation of `trainer` (archspec.train.loop.Trainer)."""
    t, model, data = trainer, trainer.model, trainer.data
    graphed = graphed_eval(t.par, t.spec)
    if not graphed:
        model.eval()
    loss_sum, windows = 0.0, 0
    kind_stats = KindStats(t.spec)  # of the kinds whose modules report statistics
    # Capability tasks (archspec.train.tasks): exact match on the answer positions, overall and per bucket.
    scorer = data.scorer() if callable(getattr(data, "scorer", None)) else None
    for i, batch in enumerate(data.val_batches):
        inputs, targets, media = split_batch(t.to_device(batch))
        # the first batch (the same windows at every evaluation) also records the per-layer stability figures
        probe = t.stability is not None and i == 0
        # hooks (the probe) or another shape would make a compiled forward compile again: those batches run eager
        through_graph = graphed and not probe and len(inputs) == t.recipe.batch_size
        logits, loss = t.stepper.evaluate(inputs, targets, through_graph,
                                          t.stability.recording if probe else nullcontext, media=media)
        if loss is None:  # a pipeline stage without the head
            continue
        if scorer is not None:  # (under tp the logits are sharded by vocabulary: gathered for a task's answers)
            from archspec.train.distributed import full_value

            scorer.add(full_value(logits), targets, data.val_buckets[i].to(targets.device))
        loss_sum += loss.item() * len(inputs)
        windows += len(inputs)
        if logits is not None:  # (per-layer kind statistics are not gathered across pipeline stages: not built)
            kind_stats.add(model, len(inputs))
    model.train()
    return _metrics(t, loss_sum, windows, scorer, kind_stats)


def _metrics(t, loss_sum: float, windows: int, scorer, kind_stats: KindStats) -> dict[str, float]:
    loss_sum, windows = t.world.sum([loss_sum, windows])
    val_loss = loss_sum / windows
    out = {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700.0))}
    if scorer is not None:  # every rank holds every bucket (the same distances): the counts line up
        out.update(scorer.metrics([int(c) for c in t.world.sum(scorer.counts())]))
    out.update(kind_stats.metrics(t.world, sum(len(b[0]) for b in t.data.val_batches)))
    if t.stability is not None:
        out.update(t.stability.eval_metrics(t.world))
        out[STABILITY_PREFIX + "loss_spikes"] = float(t.spikes.count)
    return out
