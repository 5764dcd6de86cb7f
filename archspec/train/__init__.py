"""The shared training loop: data, optimisation, checkpoints, distributed.

    from archspec.train import train
    result = train(spec, steps=100, logger=my_logger)   # → TrainResult(status, metrics, losses, checkpoint, ...)

Modules, one job each: `data` (corpus → tokens → windows), `tokenizer`, `optim` (AdamW groups, schedule), `loop`
(Trainer, train), `checkpoint`, `distributed` (device, DDP), `throughput` (peak FLOP/s, MFU), `progress` (the bar),
`run_dir` (a RunLogger writing files), `logger` (the RunLogger interface), `cache` (derived files), `cli`.

Importing this package is cheap (the registry imports `archspec.train.logger`); torch loads with the loop.
"""

from __future__ import annotations

__all__ = ["train", "Trainer", "TrainResult"]


def __getattr__(name: str):
    if name in __all__:
        from archspec.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'archspec.train' has no attribute {name!r}")
