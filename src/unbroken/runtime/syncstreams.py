"""``groups`` and ``async`` at run time: stragglers feed the all-reduce late.

STAR's all-reduce analogue of its dynamic groups is "fast workers form the ring, stragglers feed
it late". Here the lockstep cadence stays -- every member enters every step's all-reduce, since
failure detection, heartbeats and the in-band check rely on it -- but only the fastest cluster
of predicted step times (:func:`unbroken.core.sync.async_units`: complete linkage, threshold
10 % of the fastest time; under ``async`` every group is its own cluster) computes its shard
inline. Every other group runs its next shard in a background thread
(:mod:`unbroken.runtime.background`) on a *shadow* trainer holding the parameters of the step
the job started at (the trainer's ``grad`` reads the live parameters, which the commits move
meanwhile), enters the all-reduces with zeros (coverage 0 for its type) while it works, and
delivers its gradient into:

* a group alone: the first all-reduce after the job is done. Before entering a step's
  all-reduce it waits for the job until the synchronous groups are predicted to get there
  ((1 + 10 %) x the fastest predicted per-shard time x their shards), so a job that ends within
  the step is delivered fresh; a job that overran is followed at once by the next, on the
  parameters of the step it was delivered in, so a group 1.15x slower delivers in ~6 of 7
  steps, not every second one;
* a cluster of several: the step after every member reported "done" (a cell of the step
  buffer), so all members deliver together and start the next job together on the same
  parameter step -- the one extra step of staleness is the price of agreeing without a
  message of its own (a lone group knows at once that its cluster is complete);
* any job: once delivering it later would exceed :data:`~unbroken.core.sync.MAX_STALENESS`
  (4) updates, the step waits for it (every member knows the bound and the job's start). A
  step in which no group would contribute anything waits for the oldest job the same way.

The commit's update is the mean over the shards actually summed. Who delivered what comes from
the reduced buffer only (per group: the delivered data step and parameter step, a "done"
flag and its loss), checked against the in-flight jobs every member tracks alike; local
timing only decides what a group puts in. **Staleness** -- the committing step minus the
parameter step a shard was computed on -- is journaled per delivered shard (commit field
``delivered``: ``[data step, type, group, staleness]``; ``units``: the clusters delivered;
``in_flight``: the groups still computing).

Exactly once: each group works through its own shard stream (its type at data steps 0, 1, ...),
so a slow group's stream lags its step. The lag is bounded by MAX_STALENESS data steps: older
shards go to the backlog, which the synchronous groups catch up in balanced steps as under
``ksync`` (a synchronous group is never behind: its own lag goes there too). The ledger counts a
shard once, at the commit that delivers it (``plan`` for this step's own, ``catch_up`` for
older data steps), and ``data_losses`` times each data step's loss at its last shard. At the
run's last step and at a new generation (a failure re-plan, an admission) background work is
abandoned and every undelivered shard before that step goes to the backlog, which
:func:`~unbroken.core.sync.drain_step` catches up in that step (the step itself runs under the
runtime's plan): the run ends with every sample used exactly once. The catch-up cells are sized
for that drain (``_cap``: N x (2 x MAX_STALENESS + 4); more is an error, not a silent loss).

Not reproducible: which shards a step sums depends on timing, so two runs of ``groups`` or
``async`` differ (every member of one run agrees). ``sync`` is untouched: it does not build
this runner.

:class:`Streams` is mixed into :class:`~unbroken.runtime.syncmodes.ModeRunner` (it shares the
runner's state: the plan, the step buffer's cells, the backlog); this file holds the streams'
concern only: the plan of a step, the background delivery, the abandon at a new generation
and the commit's check of who delivered what.
"""

from __future__ import annotations

import time

import torch

from unbroken.core.ledger import DivergenceError
from unbroken.core.sync import Job, async_step, data_step_losses, restart_after
from unbroken.events import Event
from unbroken.runtime import stepbuf as sb

__all__ = ["Streams"]


class Streams:
    """The groups/async half of :class:`~unbroken.runtime.syncmodes.ModeRunner`."""

    def _decide_bg(self, step: int, live: set[int]) -> None:
        """groups/async: the plan of step ``step`` (:func:`unbroken.core.sync.async_step`),
        and this group's background job if it starts one now."""
        self._t_boundary = time.perf_counter()
        if step >= self.cfg.steps:
            return
        full = self._fresh_plan(sorted(live))
        self.stacks, self.depth = full.stacks, full.depth
        if step == self.cfg.steps - 1:  # the last step: everything undelivered, caught up now
            self._abandon(step)
            self.contrib, self._ap, self.effective = full.contributions(), None, "sync"
            self._drain(step, live, "last step")
            return
        ap = async_step(self._predict(), self.sync_mode, step, self.cursor, self.inflight,
                        self._ready, self.backlog, sorted(live), self.cost.cluster_fraction)
        contrib = full.contributions()
        old = self._ap_now(step - 1)
        self.cursor, self.backlog = list(ap.cursor), list(ap.backlog)
        self.inflight.update(ap.start)
        self.contrib = {w: contrib[w] for w in ap.sync}
        self._ks = (step, ap.catch_up, {}) if ap.catch_up.catch_up else None
        self._ap, self._replan = (step, ap), True
        self.effective = self.sync_mode if self.inflight else "sync"
        if old is None or old.clusters != ap.clusters or old.sync != ap.sync or ap.forced:
            self.journal({"event": Event.BENCH, "step": step, "bench": sorted(self.inflight),
                          "clusters": [list(c) for c in ap.clusters], "reason": ap.reason,
                          "depth": 1, "t": time.time()})
        me = self.my_slot
        if me in ap.start:
            self._work.start(self.trainer, ap.start[me], [me])

    def _bg_prepare(self) -> None:
        """Before this step's all-reduce: deliver my background gradient (or say it is done).
        A job of a group alone is delivered when it is done by the time the synchronous
        groups are predicted to reach the all-reduce; a cluster's, at the step after all its
        members said they were done; any, once the staleness bound is reached (then the
        step waits for it)."""
        k, w = self.step, self.my_slot
        ap, job = self._ap_now(), self.inflight.get(w)
        if ap is None or job is None or self._dv_now() is not None or self._settling \
                or self.step_error is not None:
            return
        if w in ap.deliver:
            res = self._work.wait(None)
        else:
            pred = self._predict()
            cu = sum(1 for g, _s, _t in ap.catch_up.catch_up if g == ap.sync[0]) \
                if ap.sync else 0
            deadline = (1 + self.cost.cluster_fraction) * min(pred) * (1 + cu) \
                if pred is not None else 0.0
            res = self._work.wait(self._t_boundary + deadline - time.perf_counter())
        if res is not None and res.job != job:
            raise DivergenceError(f"step {k}: background result of {res.job}, expected {job}")
        if res is None or not (w in ap.deliver or len(job.unit) == 1):
            self._dv = (k, None, res is not None)
            return
        if res.error is not None:
            self._step_failed(res.error)
            return
        self._dv = (k, res, False)
        nxt = restart_after(w, job, k, ap, self.cursor)
        if nxt is not None:  # the same job every member records at this step's commit
            self._work.start(self.trainer, nxt[0], [w])

    def _abandon(self, step: int) -> None:
        """Every undelivered shard of a data step before ``step`` (lagging or in flight) to
        the backlog; ``step``'s own shards are the runtime plan's."""
        for w in range(self.cfg.groups):
            todo = set(range(self.cursor[w], step))
            j = self.inflight.get(w)
            if j is not None and j.data_step < step:
                todo.add(j.data_step)
            self.backlog += [(s, w) for s in sorted(todo) if (s, w) not in self.backlog]
        self.backlog.sort()
        self.cursor = [step] * self.cfg.groups
        self.inflight, self._ready, self._ap, self._dv = {}, (), None, None
        self._work.abandon()

    def _commit_async(self, buf: torch.Tensor, rolled: bool) -> torch.Tensor:
        """Check and scale a groups/async step's reduced buffer (who delivered what: its
        cells), update the stream state; returns the buffer to commit."""
        n, nm, k = self.cfg.groups, self.trainer.numel, self.step
        ap = self._ap_now()
        rest = self._check_region(buf)
        c = self._cells()
        dstep, ver, ready, loss = (rest[c + i * n:c + (i + 1) * n] for i in range(4))
        live = self.live_slots(self.op_members)
        got: dict[int, Job] = {}
        for w in live:
            j = self.inflight.get(w)
            if dstep[w] == 0:
                if w in ap.deliver:
                    raise DivergenceError(f"step {k}: group {w} was to deliver {j}, read none")
                continue
            if j is None or dstep[w] != j.data_step + 1 or ver[w] != j.version + 1:
                raise DivergenceError(f"step {k}: group {w} delivered data step "
                                      f"{dstep[w] - 1:g} on step {ver[w] - 1:g}, in flight: {j}")
            got[w] = j
        want = [1.0 if w in ap.sync or (w in got and got[w].data_step == k) else 0.0
                for w in range(n)]
        ks = self._ks_now()
        cu = ks[1].catch_up if ks is not None else ()
        cells = rest[self._off + 2 * n:self._off + 2 * n + len(cu)]
        if rest[:n] != want or any(x != 1.0 for x in cells):
            raise DivergenceError(f"step {k}: {self.sync_mode} coverage {rest[:n]}, expected "
                                  f"{want}; caught-up cells {cells}")
        lo = self._off + 2 * n + self._cap
        cu_loss = rest[lo:lo + len(cu)]
        done, self.pending_loss = data_step_losses(
            self.pending_loss, k, rest[sb.LOSS], len(ap.sync),
            [(s, v) for (_w, s, _t), v in zip(cu, cu_loss)]
            + [(j.data_step, loss[w]) for w, j in got.items()], n)
        self._dl = (k, done)
        used = len(ap.sync) + len(cu) + len(got)
        if used == 0:
            raise DivergenceError(f"step {k}: {self.sync_mode} step with no gradient")
        out = buf.clone()
        out[:nm].mul_(n / used)
        out[nm:nm + n] = 1.0
        out[sb.LOSS] = (rest[sb.LOSS] + sum(cu_loss) + sum(loss[w] for w in got)) * n / used
        uid = {w: self._uid_of(w, self.op_members) for w in live}
        self._rec = (k, {
            "plan": {str(w): uid[w] for w in sorted(set(ap.sync) | {
                w for w, j in got.items() if j.data_step == k})},
            "mine": [self.my_slot] if self.my_slot in ap.sync or (
                self.my_slot in got and got[self.my_slot].data_step == k) else [],
            "catch_up": [[s, t, uid[g]] for g, s, t in cu]
            + [[j.data_step, w, uid[w]] for w, j in sorted(got.items()) if j.data_step != k],
            # per delivered shard of a stream: [data step, type, group, staleness]
            "delivered": [[k, w, uid[w], 0] for w in ap.sync]
            + [[j.data_step, w, uid[w], k - j.version] for w, j in sorted(got.items())],
            # the units delivered (a cluster's members deliver together)
            "units": sorted({tuple(uid[g] for g in j.unit) for j in got.values()}),
            "in_flight": sorted(w for w in self.inflight if w not in got),
            "data_losses": [[s, v] for s, v in sorted(done.items())],
            "clusters": [list(x) for x in ap.clusters]})
        for w, j in got.items():  # the next job: what the group itself started (_bg_prepare)
            del self.inflight[w]
            nxt = restart_after(w, j, k, ap, self.cursor)
            if nxt is not None:
                self.inflight[w] = nxt[0]
                self.backlog = sorted(self.backlog + [(s, w) for s in nxt[1]])
                self.cursor[w] = nxt[0].data_step + 1
        self._ready = tuple(w for w in live if ready[w] > 0)
        return out
