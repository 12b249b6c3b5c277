"""What a group's step time is made of, as the sync modes measure and predict it.

Two parts of a measurement. Each group also reports its run-queue wait per shard
(:func:`unbroken.runtime.resources.runqueue_wait`), so a measured time splits exactly into
the part on a core and the part *blocked* (asleep: a slow device, the network, an injected
straggler's sleep; :func:`~unbroken.core.sync.split_times`). The scheduler's noise on a shared
machine is all in the first, so the prediction is the lower envelope of the on-core parts over
:data:`WINDOW` measurements plus that of the blocked parts over only :data:`BLOCKED_WINDOW`:
a group that starts to sleep is believed slow after 3 steps, a scheduler's phase still needs
15. No prediction is made before every group has 3 measurements (a generation's first steps
are warm-up). ``groups`` and ``async`` keep the lowest whole measurement of 15: their 10 %
clustering threshold needs the long window's calm.

Shared cores. When the launcher runs every group on one machine's CPUs and there are more
groups than cores (``TrainConfig.host_cores``, set by the supervisor), a group's measured time
depends on how many groups computed beside it. Each measurement is stored as the group's time
on a core of its own (:func:`~unbroken.core.sync.uncontended`) and the cost model prices each
mode at the contention of the groups it keeps computing (``CostModel.cores``): on 2 cores,
``ksync:2`` of 4 groups computes two shards a group at full speed, as fast as ``sync``'s four
at half speed, and under one 2x straggler faster than ``ksync:3``'s three groups on two cores.

:class:`Measure` is mixed into :class:`~unbroken.runtime.syncmodes.ModeRunner` (it reads the
runner's step state); the prediction itself is the pure
:func:`unbroken.core.sync.predict_times`.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from unbroken.core.sync import predict_times
from unbroken.runtime.resources import runqueue_wait

__all__ = ["WINDOW", "BLOCKED_WINDOW", "PROBE", "Spent", "clock", "spent", "Measure"]

#: measurements of a group's per-shard time on a core behind its prediction, their minimum
#: (the load of a shared machine only ever adds time). 15, not 5: four
#: single-thread workers on two cores take turns in phases that outlast 5 steps, so a 5-step
#: minimum still read 1.78x between equal groups (bench/sync_modes.py, no straggler, quiet
#: machine) and auto left sync on it; with 15, auto on that trace stayed within 3.3 % of sync's
#: TTA and chose ksync:3 (not ksync:2) under one 2x straggler with 1 switch instead of 13.
#: The cost: a new straggler is believed 15 steps late (a recovery at once) -- where its
#: slowness is on a core (a co-located CPU hog); see BLOCKED_WINDOW for the rest.
WINDOW = 15

#: measurements behind the *blocked* part of the prediction (asleep: a slow device's or the
#: network's wait, an injected straggler's sleep; core.sync.split_times), their minimum.
#: That part is exact -- the scheduler's noise is in the run-queue wait, not in it -- so
#: three measurements are enough, and a burst is believed after 3 steps instead of 15
#: (bursty:0 has bursts of 3-21 steps; with 15, auto followed each one 15 steps late)
BLOCKED_WINDOW = 3

#: a group left out as a straggler computes its own shard type for the clock every PROBE steps
#: (how a recovery is seen). Not free where groups share cores: at 4, with both groups ksync:2
#: defers probing, the straggler's run took 12 % longer (bench/sync_modes.py, 4 groups on 2
#: cores); a fast group that is deferred does not probe
PROBE = 8

class Spent(NamedTuple):
    """What a piece of work cost this thread: wall seconds, CPU seconds and run-queue wait
    (None: unknown, no schedstat)."""

    wall: float
    cpu: float
    wait: float | None

def clock() -> tuple[float, float, float | None]:
    return time.perf_counter(), time.thread_time(), runqueue_wait()

def spent(start: tuple[float, float, float | None]) -> Spent:
    q = runqueue_wait()
    return Spent(time.perf_counter() - start[0], time.thread_time() - start[1],
                 None if q is None or start[2] is None else q - start[2])


class Measure:
    """The measuring half of :class:`~unbroken.runtime.syncmodes.ModeRunner`."""

    def _own_measure(self) -> tuple[float, float, float]:
        """This group's (wall, CPU, run-queue wait) per shard this step, as the step buffer
        carries them: wall 0: computed nothing; CPU 0 and wait -1: unknown (a background
        job's thread, no schedstat). Its own shards, plus its catch-up; else its probe."""
        own = self.grads_step == self.step
        n = self.compute_n if own else 0
        wall, cpu = (self.compute_s, self.cpu_s) if own else (0.0, 0.0)
        qs = self._qs
        wait = qs[1] if own and qs is not None and qs[0] == self.step else (None if n else 0.0)
        ex = self._extra if self._extra is not None and self._extra.step == self.step else None
        probe = self._probe[1] if self._probe is not None and self._probe[0] == self.step \
            else None
        if ex is not None and ex.shards > 0:
            k, sp = n + ex.shards, ex.spent
            out = ((wall + sp.wall) / k, (cpu + sp.cpu) / k,
                   None if wait is None or sp.wait is None else (wait + sp.wait) / k)
        elif n > 0:
            out = (wall / n, cpu / n, None if wait is None else wait / n)
        elif probe is not None:
            out = probe
        else:
            out = (0.0, 0.0, None)
        dv = self._dv_now()
        if dv is not None:  # a background job: its own time, measured on its own thread
            return (dv[1].seconds if dv[1] is not None else out[0]), 0.0, -1.0
        return out[0], out[1], -1.0 if out[2] is None else out[2]

    def _predict(self) -> list[float] | None:
        """Each group's lowest on-core part of its last WINDOW measurements plus the lowest
        blocked part of its last BLOCKED_WINDOW (:func:`unbroken.core.sync.predict_times`; a
        background group delivers only every few steps, a benched one probes); None while a
        group has fewer than BLOCKED_WINDOW measurements (a generation's first steps are
        warm-up). Under groups/async: the lowest whole measurement of WINDOW, as before."""
        n = self.cfg.groups
        rows, blocked = np.zeros((WINDOW, n)), np.full((BLOCKED_WINDOW, n), -1.0)
        for w, h in enumerate(self.hist):
            if self._bg:
                # groups/async cluster the predictions at a 10 % threshold: a short window's
                # noise split equal groups there (the in-process tests, where the GIL's waits
                # read as blocked), and a background group is measured only when it
                # delivers -- a minimum count would leave it without a prediction for long
                rows[:len(h), w] = [a + b for a, b in h]
                continue
            rows[:len(h), w] = [a for a, _b in h]
            last = [b for _a, b in h[-BLOCKED_WINDOW:]]
            blocked[:len(last), w] = last
        if self._bg:
            return predict_times(rows.tolist())
        return predict_times(rows.tolist(), blocked.tolist(), min_measured=BLOCKED_WINDOW)
