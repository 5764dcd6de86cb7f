"""The order a run reads its training items in (windows of a corpus, examples of a task): deterministic, shardable
and resumable.

Each epoch visits every item once, in a permutation drawn from (seed, epoch). One global micro-batch is the next
`batch_size · world` items of that order; rank r takes the r-th slice of `batch_size`. So one process with batch 2B
and two processes with batch B see the same global batch, and the position (epoch, cursor) is all that a checkpoint
needs to continue exactly."""

from __future__ import annotations

import numpy as np

from archspec.errors import UserError


class EpochSampler:
    """Subclasses set `n_windows` (items per epoch) and `seq_len`, and turn `my_items()` into a batch."""

    n_windows: int
    seq_len: int

    def __init__(self, batch_size: int, seed: int, rank: int = 0, world: int = 1):
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.epoch, self.cursor = 0, 0
        self._order_epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            self._order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n_windows)
            self._order_epoch = self.epoch
        return self._order

    def _take(self, count: int) -> np.ndarray:
        taken = []
        while count:
            chunk = self._epoch_order()[self.cursor: self.cursor + count]
            taken.append(chunk)
            count -= len(chunk)
            self.cursor += len(chunk)
            if self.cursor == self.n_windows:
                self.epoch, self.cursor = self.epoch + 1, 0
        return np.concatenate(taken)

    def my_items(self) -> np.ndarray:
        """This rank's slice of the next global micro-batch."""
        global_batch = self._take(self.batch_size * self.world)
        return global_batch[self.rank * self.batch_size: (self.rank + 1) * self.batch_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "seq_len": self.seq_len,
                "n_windows": self.n_windows}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "seq_len", "n_windows"):
            if state.get(key) != getattr(self, key):
                raise UserError(f"checkpoint data position was saved with {key}={state.get(key)}, this run has "
                                f"{key}={getattr(self, key)}; resume with the same data and recipe")
        if not 0 <= state["cursor"] < self.n_windows or state["epoch"] < 0:
            raise UserError(f"checkpoint data position is out of range: {state}")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
