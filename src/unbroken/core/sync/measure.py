"""What the runtime measures, as the model's inputs: per-group times on a core of their own
(groups sharing cores), split into on-core and blocked parts, predicted over a window; and who
sits out a ``mask`` step (the bench)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from unbroken.core.sync.auto import AutoDecision
from unbroken.core.sync.cost import CostModel, _times
from unbroken.core.sync.tta import _mask_greedy, flag_stragglers

__all__ = ["RUNTIME_MODES", "AUTO_MODES", "shared_cores", "uncontended", "split_times",
           "predict_times", "mask_bench", "bench_for_mode"]


#: the modes the runtime (``unbroken.runtime.syncmodes``) carries out; ``auto`` chooses among
#: sync, mask and ksync (ksync priced as the runtime runs it: ``CostModel.ksync_defers``)
RUNTIME_MODES = ("sync", "mask", "ksync", "groups", "async", "auto")


#: what the runtime's ``auto`` chooses among: ``groups`` and ``async`` are left out (their
#: estimates leave out what the runtime adds to them, and the bench finds them slower to the
#: target everywhere: ``unbroken.runtime.syncmodes``)
AUTO_MODES = ("sync", "mask", "ksync")


def shared_cores(groups: int, cores: int) -> int:
    """``CostModel.cores`` for ``groups`` groups that all compute on one machine's ``cores``
    CPU cores: the cores when the groups outnumber them, else 0 (each group has a core of its
    own, as good as a device: nothing to price)."""
    return cores if groups > cores > 0 else 0


def uncontended(walls: Sequence[float], cpus: Sequence[float], cm: CostModel) -> list[float]:
    """One step's measured per-shard times (one per group; 0 or less: computed nothing) as
    each group's time on a core of its own, so that a window mixes steps of different modes
    fairly. With a device per group (``cm.cores`` 0) they are returned as they are.

    Sharing cores, group i's wall time w_i is its CPU time c_i stretched by the contention
    s = :meth:`CostModel.contention` of the groups computing that step, plus what is not CPU
    at all (a slow device's wait, the sleep of an injected straggler): w_i = c_i s + x_i. On
    a core of its own it takes c_i + x_i, with x_i = max(0, w_i - c_i s): a group the
    scheduler favoured (w_i under c_i s) has no x_i, so its 17 ms of CPU is 17 ms whether it
    measured 34 ms or 19 (dividing by s alone read 9.5 ms for that lucky one, and the lower
    envelope of a window kept it: equal groups looked 1.9x apart). ``cpus`` <= 0: unknown
    (a background job's thread), w_i / s."""
    if cm.cores <= 0:
        return [float(v) if v > 0 else 0.0 for v in walls]
    s = cm.contention(sum(1 for v in walls if v > 0))
    out = []
    for w, c in zip(walls, cpus):
        w, c = float(w), float(c)
        out.append(0.0 if w <= 0 else w / s if c <= 0 else c + max(0.0, w - c * s))
    return out


def split_times(walls: Sequence[float], cpus: Sequence[float], waits: Sequence[float],
                cm: CostModel) -> tuple[list[float], list[float]]:
    """One step's measured per-shard times, each split into the part spent on a core and the
    part *blocked* (asleep: a device's or the network's wait, an injected straggler's sleep),
    for a predictor that trusts them differently (:func:`predict_times`).

    ``waits``: each group's run-queue wait per shard (runnable, no core:
    :func:`unbroken.runtime.resources.runqueue_wait`; below 0: unknown). Wall = CPU + wait +
    blocked, so blocked = max(0, w - c - q) is exact -- the scheduler's noise is all in the
    wait. The on-core part is what :func:`uncontended` makes of the rest: c + max(0, q - c (s -
    1)) sharing cores (the wait beyond the contention the groups make themselves: another
    process's load, or the scheduler's unfairness, which only a window shows apart), c + q with
    a device per group. The two parts add up to :func:`uncontended`'s time. A wait or CPU time
    that is unknown puts the whole time in the on-core part."""
    s = cm.contention(sum(1 for v in walls if v > 0))
    on, off = [], []
    for w, c, q in zip(walls, cpus, waits):
        w, c, q = float(w), float(c), float(q)
        b = max(0.0, w - c - q) if w > 0 and c > 0 and q >= 0 else 0.0
        if w <= 0:
            on.append(0.0)
        elif cm.cores <= 0:
            on.append(w - b)
        else:
            on.append((w - b) / s if c <= 0 else c + max(0.0, w - b - c * s))
        off.append(b)
    return on, off


def predict_times(window: Sequence[Sequence[float]],
                  blocked: Sequence[Sequence[float]] | None = None,
                  min_measured: int = 1) -> list[float] | None:
    """Each group's predicted per-shard compute time from its recent measurements (one row
    per step, one column per group; 0 or less: not measured that step, e.g. a group left out
    and not probed): the *fastest* of its measured values. The load of a shared machine only
    ever adds time to a measurement (a median of a few steps still followed it: groups were
    flagged by the scheduler, not by their speed), while a slow machine is slow on every step,
    so the lower envelope keeps the ratio a trace injects and flags a group only once it was
    slow on every step of the window; it sees a recovery at the first fast step. None while
    some group has no measurement.

    ``blocked``: rows of each group's blocked time per shard (:func:`split_times`; then
    ``window`` holds the on-core parts), usually a shorter window: a group's prediction is
    the sum of the two envelopes. Blocked time carries none of the scheduler's noise, so a
    group that starts to sleep (a burst on a slow machine) is seen after a few steps rather
    than a whole window; the on-core part still needs the long one. A step a group was not
    measured reads below 0 in ``blocked`` (0 is a measurement there: no sleep).

    ``min_measured``: None until every group has that many measurements in ``window``. The
    runtime asks for 3: a run's (or a generation's) first two steps are warm-up -- 25-31 ms a
    shard against 15 steady, unequally between groups -- and a prediction from them alone
    sent ``auto`` into ``ksync:2`` at step 2 without a straggler (bench/sync_modes.py, 'none',
    1 run of 9), where it stayed 24 steps until the probes saw the groups it deferred."""
    if not window:
        return None
    cols = np.asarray(window, dtype=float).T
    out = []
    for c in cols:
        v = c[c > 0]
        if v.size < max(1, min_measured):
            return None
        out.append(float(v.min()))
    if blocked:
        for i, c in enumerate(np.asarray(blocked, dtype=float).T):
            v = c[c >= 0]
            out[i] += float(v.min()) if v.size else 0.0
    return out


def mask_bench(times: Sequence[float], benched: Sequence[int],
               cm: CostModel) -> tuple[tuple[int, ...], str]:
    """``mask``'s decision for the next step: which groups to leave out.

    Candidates are the groups predicted over ``cm.straggler_ratio`` x the fastest (with the
    hysteresis of :func:`flag_stragglers` around the ones left out now); of them the subset of
    :func:`_mask_greedy` (each one left out must make the predicted step sooner: the
    survivors' deeper stacks against the wait). So a 3x straggler at r = 2 is left out (a
    2-deep stack is sooner) and a 2x one is not (a wash). Returns (groups, reason)."""
    t = _times(times)
    flagged = flag_stragglers(t, cm.straggler_ratio, benched)
    if not flagged:
        return (), "mask: no straggler predicted"
    est = _mask_greedy(t, flagged, cm)
    return est.left_out, (f"mask: stragglers {list(flagged)}: {est.note}; predicted step "
                          f"{est.tta:.4g} s vs sync {float(cm.stretch(t.max(), t.size)):.4g} s")


def bench_for_mode(d: AutoDecision, benched: Sequence[int]) -> tuple[int, ...]:
    """The groups ``auto`` leaves out after decision ``d``: under ``mask`` the subset its
    selection estimated (``benched``, the ones out now, while it did not re-select); none
    under any other mode."""
    if d.mode != "mask":
        return ()
    if d.selection is not None:
        return d.selection.estimates["mask"].left_out
    return tuple(benched)
