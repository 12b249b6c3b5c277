"""The data plan: which samples each shard type of each step holds, and the exactly-once check.

Why a pure, deterministic plan
------------------------------
In stacked data parallelism a step's global batch is cut into N *shard types*. When a group
dies, a survivor that holds the orphaned type in its stack computes that type's gradient
(the patch compute). That only works if *any* group can compute *any* shard from nothing but
(seed, step, type): so the sample indices are a pure function of those, and no data loader
state has to be moved between processes.

Each epoch is a permutation of ``range(dataset_size)`` seeded by ``(seed, epoch)``; step ``k``
of epoch ``e`` takes the next ``N * shard_size`` indices of that permutation (the tail that does
not fill a whole step is dropped, so every step has the same size), and shard type ``t`` is the
``t``-th slice of ``shard_size`` of those. Every sample is therefore consumed exactly once per
epoch, *provided* every (step, type) gradient is committed exactly once: that is what
:func:`exactly_once` checks from the committed contribution records.

Pure: no torch, no I/O, no clock (numpy only).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

import numpy as np

__all__ = ["DataPlan", "LedgerReport", "exactly_once"]


@dataclass(frozen=True)
class DataPlan:
    """Sample indices per (step, shard type).

    Attributes:
        dataset_size: number of samples in the dataset.
        types: N, the number of shard types per step (one per data-parallel group).
        shard_size: samples per shard type.
        seed: seed of the per-epoch permutations.
    """

    dataset_size: int
    types: int
    shard_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.types < 1:
            raise ValueError(f"types must be at least 1, got {self.types}")
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be at least 1, got {self.shard_size}")
        if self.dataset_size < self.global_batch:
            raise ValueError(
                f"dataset of {self.dataset_size} samples is smaller than one global batch "
                f"({self.types} types x {self.shard_size} = {self.global_batch})")

    @property
    def global_batch(self) -> int:
        return self.types * self.shard_size

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.global_batch

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def permutation(self, epoch: int) -> np.ndarray:
        """The (read-only) sample order of ``epoch``."""
        return _permutation(self.dataset_size, self.seed, epoch)

    def shard(self, step: int, shard_type: int) -> list[int]:
        """Sample indices of shard type ``shard_type`` at global step ``step``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if not 0 <= shard_type < self.types:
            raise ValueError(f"shard type {shard_type} outside [0, {self.types})")
        spe = self.steps_per_epoch
        perm = self.permutation(step // spe)
        start = (step % spe) * self.global_batch + shard_type * self.shard_size
        return [int(i) for i in perm[start:start + self.shard_size]]

    def step_samples(self, step: int) -> list[int]:
        """All samples of ``step``, shard type 0 first."""
        return [i for t in range(self.types) for i in self.shard(step, t)]


@lru_cache(maxsize=8)
def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    perm = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch]))).permutation(n)
    perm.setflags(write=False)
    return perm


@dataclass(frozen=True)
class LedgerReport:
    """Result of the exactly-once check. ``ok`` iff nothing is missing, duplicated or stray."""

    missing: tuple[tuple[int, int], ...]
    duplicated: tuple[tuple[int, int], ...]
    stray: tuple[tuple[int, int], ...]
    records: int

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.stray)


def exactly_once(records: Iterable[tuple[int, int, int]], steps: int, types: int) -> LedgerReport:
    """Check that every (step, shard type) of steps ``0..steps-1`` was committed exactly once.

    Args:
        records: committed contributions ``(step, shard_type, group)``: one per shard-type
            gradient that went into a committed all-reduce.
        steps: number of committed steps expected.
        types: N, shard types per step.

    Returns:
        A :class:`LedgerReport`: ``missing`` (no record), ``duplicated`` (two or more records,
        whether from one group or several), ``stray`` (step or type outside the expected range),
        each a sorted tuple of (step, type) pairs.
    """
    counts = Counter()
    n = 0
    for step, t, _group in records:
        counts[(int(step), int(t))] += 1
        n += 1
    expected = {(k, t) for k in range(steps) for t in range(types)}
    missing = sorted(p for p in expected if counts[p] == 0)
    duplicated = sorted(p for p, c in counts.items() if c > 1 and p in expected)
    stray = sorted(p for p in counts if p not in expected)
    return LedgerReport(tuple(missing), tuple(duplicated), tuple(stray), n)
