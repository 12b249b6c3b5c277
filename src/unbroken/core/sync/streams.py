"""``groups`` and ``async`` as the runtime runs them: clusters of groups (or single groups)
that each stream their own shards, bounded by :data:`MAX_STALENESS`, and where a stream
restarts after a failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from unbroken.core.sync.cost import _times
from unbroken.core.sync.gap import cluster_times
from unbroken.core.sync.ksync import KsyncStep, drain_step

__all__ = ["MAX_STALENESS", "Job", "async_units", "stream_shard", "AsyncStep", "async_step",
           "restart_after"]


#: ``groups`` / ``async`` in the runtime: a background gradient is applied at most this many
#: updates after the parameters it was computed on (past it the step waits for it), and a
#: group's shard stream lags its step by at most this many data steps (older shards go to the
#: backlog the synchronous groups catch up)
MAX_STALENESS = 4


@dataclass(frozen=True)
class Job:
    """A background job of one group: its gradient of ``data_step`` (its own shard types) on
    the parameters of step ``version``; ``unit``: the groups that started it together (they
    deliver together)."""

    version: int
    data_step: int
    unit: tuple[int, ...]


def async_units(times: Sequence[float], mode: str, fraction: float = 0.1,
                live: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """The clusters of ``mode`` over the ``live`` groups (default all), fastest first:
    ``groups`` :func:`cluster_times` on the predicted times (the threshold ``fraction`` x the
    fastest time), ``async`` every group alone."""
    live = list(range(len(times))) if live is None else sorted(int(w) for w in live)
    if not live:
        return []
    t = _times([times[w] for w in live])
    if mode == "async":
        return [(live[i],) for i in sorted(range(len(live)), key=lambda i: (t[i], live[i]))]
    if mode != "groups":
        raise ValueError(f"async_units: mode {mode!r} is neither groups nor async")
    return [tuple(sorted(live[i] for i in c)) for c in cluster_times(t, fraction)]


def stream_shard(cursor: int, step: int, max_lag: int = MAX_STALENESS) -> tuple[int, list[int]]:
    """The data step a group's job starting at ``step`` computes: the oldest of its stream not
    taken yet (``cursor``), but at most ``max_lag`` behind ``step``; the data steps skipped
    (they go to the backlog)."""
    if cursor > step:
        raise ValueError(f"cursor {cursor} is ahead of step {step}")
    lo = max(cursor, step - max_lag)
    return lo, list(range(cursor, lo))


@dataclass(frozen=True)
class AsyncStep:
    """``groups`` / ``async``'s plan for one step, the same on every member.

    ``sync``: the groups computing this step's own shard inline (the fastest cluster);
    ``start``: group -> the job it starts in the background at this boundary; ``deliver``:
    in-flight groups every member knows deliver in this step (``forced`` by the staleness
    bound, or a cluster whose members all reported ready at the previous commit); a job of a
    group alone may also be delivered in the step, which only the reduced buffer says;
    ``catch_up``: backlog shards the sync groups compute; ``backlog``, ``cursor``: the state
    after the boundary (``cursor[w]``: the first data step of group w's stream no job has
    taken; the backlog still holds the shards caught up in this step: they leave it at the
    commit that computes them); ``clusters``: the clustering this boundary used."""

    sync: tuple[int, ...]
    start: dict[int, Job]
    deliver: tuple[int, ...]
    forced: tuple[int, ...]
    catch_up: KsyncStep
    backlog: tuple[tuple[int, int], ...]
    cursor: tuple[int, ...]
    clusters: tuple[tuple[int, ...], ...]
    reason: str


def async_step(times: Sequence[float] | None, mode: str, step: int, cursor: Sequence[int],
               inflight: dict[int, Job], ready: Sequence[int],
               backlog: Sequence[tuple[int, int]], live: Sequence[int],
               fraction: float = 0.1, max_staleness: int = MAX_STALENESS) -> AsyncStep:
    """The plan of step ``step`` under ``groups`` or ``async`` (each group's stream is its own
    shard type ``w`` at data steps 0, 1, ...).

    The clusters come from the predicted times (:func:`async_units`; None: no prediction
    yet, every group is synchronous). An idle group of the fastest cluster computes this
    step's own shard inline (its lag, if any, goes to the backlog: a synchronous group is
    never behind); an idle group of another cluster starts a background job on this step's
    parameters, together with the idle members of its cluster, on the oldest shard of its
    stream (:func:`stream_shard`). An in-flight job must be delivered in this step when it
    would otherwise exceed ``max_staleness``, and is when its cluster (of two or more)
    reported ready at the last commit. The sync groups catch up the backlog in balanced
    steps (as ``ksync``: m = ceil(background / sync) shards each, more when it is long); with
    no group in the background they catch all of it up."""
    live = sorted(int(w) for w in live)
    n = len(cursor)
    cur = list(int(c) for c in cursor)
    back = list(backlog)
    if times is None:
        clusters: list[tuple[int, ...]] = [tuple(w for w in live)]
    else:
        clusters = async_units(times, mode, fraction, live)
    fast = set(clusters[0]) if clusters else set()
    sync = tuple(w for w in live if w in fast and w not in inflight)
    for w in sync:  # a synchronous group computes this step's shard: its lag to the backlog
        back += [(s, w) for s in range(cur[w], step)]
        cur[w] = step + 1
    start: dict[int, Job] = {}
    for c in clusters:
        unit = tuple(w for w in c if w not in fast and w not in inflight)
        for w in unit:
            s, skipped = stream_shard(cur[w], step, max_staleness)
            back += [(k, w) for k in skipped]
            cur[w] = s + 1
            start[w] = Job(step, s, unit)
    ready_set = set(int(w) for w in ready)
    forced = tuple(sorted(w for w, j in inflight.items() if step - j.version >= max_staleness))
    deliver = tuple(sorted(set(forced) | {w for w, j in inflight.items() if len(j.unit) > 1
                                          and all(g in ready_set for g in j.unit)}))
    jobs = {**inflight, **start}
    if not sync and not deliver and jobs:  # a step with no gradient: wait for the oldest job
        w0 = min(jobs, key=lambda w: (jobs[w].version, jobs[w].data_step, w))
        forced = tuple(sorted(g for g in jobs[w0].unit if g in jobs))
        deliver = forced
    back.sort()
    if not sync or not back:
        cu = KsyncStep((), (), "nothing to catch up")
    elif not start and not inflight:
        cu = drain_step(back, sync, f"{mode}: no group in the background")
    else:
        m = -(-(len(live) - len(sync)) // len(sync))
        take = m * len(sync) * max(1, len(back) // (2 * n))
        cu = KsyncStep((), tuple((sync[i % len(sync)], int(s), int(t))
                                 for i, (s, t) in enumerate(back[:take])), "") \
            if len(back) >= m * len(sync) else KsyncStep((), (), "")
    why = (f"{mode}: clusters {[list(c) for c in clusters]}, synchronous {list(sync)}"
           + (f", starting {sorted(start)}" if start else "")
           + (f", in flight {sorted(inflight)}" if inflight else "")
           + (f", forced by the staleness bound {list(forced)}" if forced else "")
           + (f", {len(cu.catch_up)} backlog shard(s) caught up" if cu.catch_up else ""))
    return AsyncStep(sync, start, deliver, forced, cu, tuple(back), tuple(cur),
                     tuple(clusters), why)


def restart_after(w: int, job: Job, step: int, plan: AsyncStep, cursor: Sequence[int],
                  max_staleness: int = MAX_STALENESS) -> tuple[Job, list[int]] | None:
    """The job group ``w`` starts at once when it delivers ``job`` in step ``step`` (before
    that step's all-reduce, on its parameters), or None: it waits for the next boundary.
    A job delivered in the step it started (fresh) is followed at the next boundary, on
    fresher parameters; one that overran is followed at once (the group would idle for the
    rest of the step), unless the boundary put ``w`` in the fastest cluster (it becomes
    synchronous at the next one). Its unit: the members of ``job.unit`` that share ``w``'s
    cluster of ``plan`` (they deliver together, so they restart together). Returns (the job,
    the data steps of ``w``'s stream it skips: to the backlog)."""
    if step == job.version or any(w in c for c in plan.clusters[:1]):
        return None
    mine = next((c for c in plan.clusters if w in c), (w,))
    s, skipped = stream_shard(cursor[w], step, max_staleness)
    return Job(step, s, tuple(g for g in job.unit if g in mine)), skipped
