"""What each step trains on: seeded passes over the train rows (resumable by position), and
endless shuffled batches of demonstrations for the warm start."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


class TaskSampler:
    """Rows in a fresh seeded order each epoch, `batch_size` at a time; `position` (rows handed out
    so far) is all a checkpoint needs to continue the same sequence."""

    def __init__(self, n_rows: int, batch_size: int, seed: int, position: int = 0) -> None:
        if n_rows < 1 or batch_size < 1:
            raise ValueError("a sampler needs rows and a positive batch size")
        self.n_rows = n_rows
        self.batch_size = batch_size
        self.seed = seed
        self.position = position

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_rows)

    def next_batch(self) -> list[int]:
        """The row indices of the next step (a batch may span the end of one epoch and the next)."""
        out: list[int] = []
        while len(out) < self.batch_size:
            epoch, offset = divmod(self.position, self.n_rows)
            take = min(self.batch_size - len(out), self.n_rows - offset)
            out.extend(self._order(epoch)[offset : offset + take].tolist())
            self.position += take
        return out

    @property
    def epoch(self) -> float:
        """Passes over the data so far (fractional)."""
        return self.position / self.n_rows


def demonstration_batches(transitions: Sequence[Any], batch_size: int, pad_id: int, seed: int) -> Iterator[Any]:
    """Endless shuffled batches of demonstration transitions (a fresh order each pass)."""
    from alight.algorithms.batch import TransitionBatch

    rng = random.Random(seed)
    order = list(range(len(transitions)))
    while True:
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1 if len(order) >= batch_size else 1, batch_size):
            yield TransitionBatch.from_transitions([transitions[i] for i in order[start : start + batch_size]], pad_id)
