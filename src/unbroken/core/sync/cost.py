"""Sync modes and the cost model every mode is priced by (``CostModel``: batch, noise scale,
all-reduce share, redundancy, staleness cost, cores shared), and the runtime's settings of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["MODES", "Mode", "parse_mode", "RUNTIME_MIN_GAIN", "RUNTIME_MC_UPDATES", "CostModel"]


MODES = ("sync", "mask", "ksync", "groups", "async", "auto")


#: the order ties are broken in: the safest (most synchronous) mode first
_PREFERENCE = ("sync", "mask", "ksync", "groups", "async")


@dataclass(frozen=True)
class Mode:
    """A sync mode: ``name`` one of MODES, ``k`` set for ksync only."""

    name: str
    k: int | None = None

    def __str__(self) -> str:
        return f"ksync:{self.k}" if self.name == "ksync" else self.name


def parse_mode(text: str, groups: int) -> Mode:
    """``sync``, ``mask``, ``ksync:K`` (1 <= K <= groups), ``groups``, ``async`` or ``auto``;
    ValueError naming the bad value otherwise."""
    name, colon, arg = text.partition(":")
    if name == "ksync":
        if not colon:
            raise ValueError(f"sync mode {text!r}: ksync needs K, as ksync:K")
        try:
            k = int(arg)
        except ValueError:
            raise ValueError(f"sync mode {text!r}: K {arg!r} is not an integer") from None
        if not 1 <= k <= groups:
            raise ValueError(f"sync mode {text!r}: K {k} outside [1, {groups}] (the number of "
                             f"groups)")
        return Mode("ksync", k)
    if name in MODES and not colon:
        return Mode(name)
    raise ValueError(f"unknown sync mode {text!r} (expected sync, mask, ksync:K, groups, "
                     f"async or auto)")


#: the predicted TTA gain over sync the runtime's ``auto`` needs to leave (or stay out of)
#: sync. The model's default 2 % assumes predictions as good as the trace; on a shared machine
#: equal groups' predicted times spread by up to 1.76x (bench/sync_modes.py beside other
#: load), so small predicted gains were noise: auto went into ksync with no straggler and,
#: with the straggler set never empty, did not come back. A 2x straggler predicts ~33 % for
#: ksync:3.
RUNTIME_MIN_GAIN = 0.15


#: updates of the ksync Monte-Carlo when the runtime re-selects (STAR's 1,000 cost ~20 ms)
RUNTIME_MC_UPDATES = 200


@dataclass(frozen=True)
class CostModel:
    """What the TTA model needs besides the predicted step times.

    Attributes:
        shard_batch: B, samples per group per step.
        noise_scale: phi, the gradient noise scale in samples (see :class:`NoiseScale`).
        comm_s: the all-reduce part of every group's step time (the rest is compute).
        redundancy: SPARe's r (each group hosts r shard types); ``mask`` needs r >= 2.
        staleness_cost: lambda, the TTA penalty per update of mean staleness.
        cluster_fraction: the ``groups`` linkage threshold as a share of the fastest step.
        straggler_ratio: a group slower than this x the fastest is a straggler (STAR: 1.2).
        min_gain: a mode other than sync must beat sync's TTA by this share to be chosen.
        mc_updates: updates in the ksync Monte-Carlo (STAR: 1,000).
        seed: seeds the Monte-Carlo's tie-breaking.
        ksync_defers: price ``ksync`` as the runtime runs it (the late groups' samples are
            deferred and caught up on fresh parameters: :func:`ksync_defer_estimate`, K the
            best of 1..N-1) instead of STAR's k-sync (late gradients applied stale).
        cores: the CPU cores the groups' compute shares; 0: each group computes on a device
            of its own (STAR's setting, and every cluster's). With N groups on C < N cores,
            P groups computing at once each get min(1, C / P) of a core (processor sharing:
            :meth:`contention`), so a mode that idles some groups speeds up the others --
            ``ksync:2`` of 4 groups on 2 cores computes 2 shards a group at full speed, as fast
            as ``sync``'s 4 at half speed. The times the model is given are then each group's
            per-shard time on a core of its own (:func:`uncontended`), and each mode's step is
            priced at the contention of the groups it keeps computing.
    """

    shard_batch: int = 8
    noise_scale: float = 0.0
    comm_s: float = 0.0
    redundancy: int = 1
    staleness_cost: float = 0.1
    cluster_fraction: float = 0.1
    straggler_ratio: float = 1.2
    min_gain: float = 0.02
    mc_updates: int = 1000
    seed: int = 0
    ksync_defers: bool = False
    cores: int = 0

    @classmethod
    def for_runtime(cls, shard_batch: int, redundancy: int, noise_scale: float = 0.0,
                    comm_s: float = 0.0, seed: int = 0, cores: int = 0) -> "CostModel":
        """The model the runtime's ``auto`` decides with, and ``plan --stragglers`` prices
        by (one selector): ``ksync`` as the runtime runs it (deferral, nothing stale), a
        :data:`RUNTIME_MC_UPDATES`-update Monte-Carlo, and :data:`RUNTIME_MIN_GAIN` to
        leave sync."""
        return cls(shard_batch=shard_batch, redundancy=redundancy, noise_scale=noise_scale,
                   comm_s=comm_s, seed=seed, mc_updates=RUNTIME_MC_UPDATES,
                   ksync_defers=True, min_gain=RUNTIME_MIN_GAIN, cores=cores)

    def __post_init__(self) -> None:
        if self.shard_batch < 1:
            raise ValueError(f"shard batch {self.shard_batch} must be at least 1")
        for name in ("noise_scale", "comm_s", "staleness_cost", "min_gain"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} {v!r} must be a finite number >= 0")
        if not self.cluster_fraction > 0:
            raise ValueError(f"cluster_fraction {self.cluster_fraction!r} must be > 0")
        if not self.straggler_ratio > 1:
            raise ValueError(f"straggler_ratio {self.straggler_ratio!r} must be > 1")
        if self.redundancy < 1 or self.mc_updates < 1:
            raise ValueError(f"redundancy {self.redundancy} and mc_updates "
                             f"{self.mc_updates} must be at least 1")
        if not (isinstance(self.cores, int) and self.cores >= 0):
            raise ValueError(f"cores {self.cores!r} must be an integer >= 0")

    def contention(self, computing: int) -> float:
        """How much slower than on a core of its own each of ``computing`` groups computing
        at once runs: max(1, computing / cores); 1 with a device per group (``cores`` 0)."""
        return 1.0 if self.cores <= 0 else max(1.0, computing / self.cores)

    def stretch(self, t: float | np.ndarray, computing: int) -> float | np.ndarray:
        """Step time(s) ``t`` (compute + ``comm_s``) with ``computing`` groups computing at
        once: the compute part stretched by :meth:`contention`, the all-reduce not; ``t``
        unchanged with a device per group."""
        if self.cores <= 0:
            return t
        return self.comm_s + np.maximum(t - self.comm_s, 0.0) * self.contention(computing)

    def iters(self, batch: float) -> float:
        """Relative iterations to the same progress at ``batch`` samples per update."""
        return 1.0 + self.noise_scale / batch


def _times(times: Sequence[float] | np.ndarray) -> np.ndarray:
    t = np.asarray(times, dtype=float)
    if t.ndim not in (1, 2) or t.size == 0:
        raise ValueError(f"step times must be a non-empty vector or (steps, groups) array, got "
                         f"shape {t.shape}")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("step times must be finite and positive")
    return t
