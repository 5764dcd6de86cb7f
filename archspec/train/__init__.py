"""The shared training loop: data, optimisation, checkpoints, distributed.

    from archspec.train import train
    result = train(spec, steps=100, logger=my_logger)   # → TrainResult(status, metrics, losses, checkpoint, ...)

Modules, one job each: `loop` (Trainer, train: setup, the step, the run around it), `parallelize` (the layout
applied in one order: pipeline cut, TP/EP, activation checkpointing, compile, data parallelism, the schedule),
`step` (the local and the pipeline step, one interface), `precision` (autocast, loss scaler, fp8, FSDP policy),
`checkpointer` (start, save, resume, interrupt saves) over `checkpoint` (the file format), `evaluation`, `report`
(start lines, the record, the summary), `build` (a run's derived facts), `data` (corpus → tokens → windows),
`tokenizer`, `optim` (AdamW groups, schedule), `distributed` (device, DDP), `mesh`, `parallel`, `pipeline`,
`tensor_parallel`, `expert_parallel`, `throughput` (peak FLOP/s, MFU, peak memory), `metrics`, `progress` (the bar),
`run_dir` (a RunLogger writing files), `logger` (the RunLogger interface), `sinks`.

Importing this package is cheap (the registry imports `archspec.train.logger`); torch loads with the loop.
"""

from __future__ import annotations

__all__ = ["train", "Trainer", "TrainResult"]


def __getattr__(name: str):
    if name in __all__:
        from archspec.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'archspec.train' has no attribute {name!r}")
