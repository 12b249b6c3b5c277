"""``ksync`` as the runtime runs it: which groups a step waits for, which shards are deferred
and caught up by the fast groups on fresh parameters, and the fair loss of a data step whose
shards were spread over several steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from unbroken.core.sync.cost import _times

__all__ = ["KsyncStep", "ksync_step", "drain_step", "data_step_losses"]


@dataclass(frozen=True)
class KsyncStep:
    """One ``ksync:K`` step in the runtime.

    ``late``: the groups predicted slowest (N - K of them) whose own shard types this step
    does *not* compute: those samples are deferred (``deferred`` is filled by the caller from
    the plan); ``catch_up``: ``(group, data step, type)`` deferred shards computed this step,
    oldest first; ``reason``: the journal line."""

    late: tuple[int, ...]
    catch_up: tuple[tuple[int, int, int], ...]
    reason: str


def ksync_step(times: Sequence[float] | None, groups: int, k: int,
               backlog: Sequence[tuple[int, int]], last: bool) -> KsyncStep:
    """``ksync:K``'s plan for the next step, the same on every member.

    The step commits with the K groups predicted fastest (``times``, one per group; None: no
    prediction yet, every group takes part); the other N - K defer their shard types.
    Deferred shards (``backlog``: (data step, type), oldest first) are caught up so that every
    sample is used exactly once: once there are ``m`` per fast group (m = ceil((N - K) / K),
    what keeps the backlog bounded: under 2N), each fast group computes m of them (a step in
    which all of them carry m more shards costs m shards more, not a wait for the straggler),
    and the ``last`` step of the run defers nothing and spreads the whole backlog over every
    group. A shard is computed on the parameters of the
    step that uses it: the data order changes, not the staleness."""
    if not 1 <= k <= groups:
        raise ValueError(f"k {k} outside [1, {groups}]")
    if last:
        return drain_step(backlog, range(groups), f"ksync:{k}: last step")
    if times is None:
        return KsyncStep((), (), f"ksync:{k}: no prediction yet, every group takes part")
    t = _times(times)
    if t.size != groups:
        raise ValueError(f"{t.size} times for {groups} groups")
    order = sorted(range(groups), key=lambda i: (t[i], i))
    late = tuple(sorted(order[k:]))
    fast = sorted(order[:k])
    m = -(-(groups - k) // k)
    cu: tuple[tuple[int, int, int], ...] = ()
    if m and len(backlog) >= m * k:
        cu = tuple((fast[i % k], int(s), int(ty))
                   for i, (s, ty) in enumerate(backlog[:m * k]))
    why = (f"ksync:{k}: commits with {fast}, defers {list(late)}"
           + (f", {len(cu)} deferred shard(s) caught up" if cu else ""))
    return KsyncStep(late, cu, why)


def drain_step(backlog: Sequence[tuple[int, int]], over: Sequence[int],
               why: str = "drain") -> KsyncStep:
    """A step that defers nothing and catches up the whole ``backlog`` spread round-robin over
    the groups ``over`` (the ones computing in that step): the last step of a run, the step
    after a re-plan (a failure, an admission: whatever the interrupted step was to catch up
    goes to whoever is live now) or after ``auto`` leaves ``ksync``. Without it a deferred
    shard would be used never -- the ledger would report it missing. Empty ``over`` (nobody
    computes) or backlog: no catch-up."""
    over = sorted(int(w) for w in over)
    if not over or not backlog:
        return KsyncStep((), (), f"{why}: nothing deferred to catch up")
    cu = tuple((over[i % len(over)], int(s), int(ty)) for i, (s, ty) in enumerate(backlog))
    return KsyncStep((), cu, f"{why}: {len(cu)} deferred shard(s) caught up over groups {over}")


def data_step_losses(pending: dict[int, tuple[float, int]], step: int, own_sum: float,
                     own_n: int, caught_up: Sequence[tuple[int, float]], types: int
                     ) -> tuple[dict[int, float], dict[int, tuple[float, int]]]:
    """The loss of every *data step* whose ``types`` shards have now all been computed: what
    makes the loss of a mode that defers samples comparable with ``sync``'s.

    A step's committed loss under ``sync`` is the mean training loss of its N shard types,
    each on the parameters it is trained on. Under ``ksync`` the step's own loss leaves out
    the deferred types, always the same ones under a persistent straggler, and a mean over
    fewer shards is noisier, so it dips under a target sooner: neither is the quantity
    ``sync`` reports. So a data step's loss here is the mean over all N of its shards, each
    taken when its gradient is computed (a deferred one at its catch-up, on the parameters it
    is trained on there), known -- and timed -- once the last of them is computed. It covers
    the very samples of ``sync``'s step, so the data noise of a per-step loss is the same in
    both modes. A held-out evaluation would cost forward passes in every mode and a change of
    the synchronous path; this costs nothing.

    ``pending``: data step -> (loss sum, shards) so far; ``step`` the step being committed,
    whose own computed shards have the loss sum ``own_sum`` over ``own_n`` shards;
    ``caught_up``: (data step, loss) of each deferred shard computed in it. Returns (complete
    data steps -> mean loss, the new pending); does not modify ``pending``."""
    acc = dict(pending)
    for s, v, c in [(step, own_sum, own_n)] + [(s, l, 1) for s, l in caught_up]:
        if c:
            old = acc.get(int(s), (0.0, 0))
            acc[int(s)] = (old[0] + float(v), old[1] + int(c))
    done = {s: v / c for s, (v, c) in acc.items() if c >= types}
    return done, {s: vc for s, vc in acc.items() if s not in done}
