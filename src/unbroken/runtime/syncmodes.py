"""Sync modes at run time (``--sync mask``, ``ksync:K``, ``groups``, ``async`` and ``auto``):
the stacked step of
:mod:`unbroken.runtime.stacked`, plus a decision at every step boundary about which groups
the next step leaves out (and, under ``ksync``, which deferred shards it catches up).
``--sync sync`` (the default) does not build this runner at all: the synchronous step stays
byte for byte :class:`~unbroken.runtime.stacked.StackedRunner`.

``mask``: SPARe's redundancy turned on stragglers
-------------------------------------------------
A group predicted to be late is *benched*: it is left out of the next step like a failed one
and :func:`unbroken.core.rectlr.decide` gives its shard types to their other hosts (the plan
a failure would get). It stays a member: it keeps the state, applies every commit, and joins
the all-reduce with zeros for the types it no longer computes, so nothing re-forms and the
gradient is exactly the synchronous one (up to the order of a float sum). It pays when the
straggler is slower than the deepest stack a survivor then carries (a 3x straggler at r = 2:
a 2-deep stack instead of waiting 3x; a 2x one: a wash, and ``auto`` stays ``sync``).

``ksync:K``: commit with the first K
------------------------------------
The N - K groups predicted slowest compute nothing of their own this step: their shard types
are *deferred* (a (data step, type) backlog every member keeps alike). The in-band coverage
reads 0 for them, which the shared plan accounts for, and the update is the mean over the
shards actually summed. Deferred shards are caught up by the fast groups in balanced steps
(:func:`unbroken.core.sync.ksync_step`: all fast groups carry the same extra shards, so the
step costs that much more instead of the straggler's wait). The whole backlog is *drained*
(:func:`unbroken.core.sync.drain_step`: nothing deferred, the backlog spread over the groups
computing) at the run's last step, at the step a new generation re-plans (a failure or an
admission: the interrupted step runs under the runtime's plan, and whatever it was to catch up
goes to whoever is live now -- so a group dying in, or down at, the last step leaves nothing
unused), at every step while a failure plan is in force, and at the step ``auto`` leaves
``ksync``. Each sample is used exactly once; the ledger counts a caught-up shard at its data
step (commit fields ``deferred`` and ``catch_up``). Unlike STAR's k-sync the late gradient is
not stale: a deferred shard is computed on the parameters of the step that uses it; what
changes is the data order (so the trajectory is not the synchronous one). The backlog is the
exactly-once state: a joiner gets it with the state copy.

The loss ``ksync`` is judged by
--------------------------------
A commit's ``loss`` is the mean over the step's own computed shards; under a persistent
straggler that leaves the same shard type out of every step, and a mean over fewer shards dips
below a target sooner by noise alone -- neither is what ``sync`` reports. So a ksync commit
also journals ``data_losses``: every *data step* whose N shards are now all computed, with the
mean of their N losses, each taken when its gradient was computed (a deferred one at its
catch-up; the loss cells ride in the step buffer, one per caught-up shard, so every member
journals the same). TTA and the final loss read those
(:func:`unbroken.core.stragglers.data_step_loss_points`): the very samples of ``sync``'s step,
timed when the last of them is computed (:func:`unbroken.core.sync.data_step_losses` says why
not a held-out evaluation).

``groups`` and ``async``
------------------------
Stragglers feed the all-reduce late: :mod:`unbroken.runtime.syncstreams`.

``auto``
--------
:func:`unbroken.core.sync.decide` among ``sync``, ``mask`` and ``ksync`` (priced by deferral:
:func:`~unbroken.core.sync.ksync_defer_estimate`, K the best of 1..N-1); a ``ksync:K`` choice
runs the ksync step above with that K, and leaving it drains the backlog. It does not choose
``groups`` or ``async``: their estimates (update gap 1 / sum over clusters, staleness priced by
an assumed ``staleness_cost`` of 0.1 per update) are not those of the modes as run here (a
cluster's extra step of staleness, the waits at the bound, the lag's catch-up on the
synchronous groups and the drain at the end are not in them), and nothing has checked that a
choice made on them is sound; switching into or out of them would also need the background
work abandoned and drained at the switch, which is not built.

What every member decides from
------------------------------
The step buffer carries, past the digests, two cells per group (one writer each, so the sum
is the value; two more at the end: the CPU seconds and the run-queue wait per shard), catch-up coverage and loss cells (2N each; more under groups/async, see above)
and, under groups/async, four cells per group (see above). The two cells per group: the
group's own compute per shard type this step (0: computed nothing) and the squared norm of one
of its shard gradients (the noise scale's small batch; the reduced gradient's norm is the big
batch: :class:`unbroken.core.sync.NoiseScale`, McCandlish et al.).
Every member reads the same reduced bytes, keeps the same last :data:`WINDOW` measurements
of each group, and calls the same pure functions of :mod:`unbroken.core.sync`
(:func:`~unbroken.core.sync.predict_times`, :func:`~unbroken.core.sync.mask_bench`,
:func:`~unbroken.core.sync.decide`), so all take the same plan at the same boundary without
a message of their own. A group left out as a straggler has no compute to report, so every
:data:`PROBE` steps it computes its own first shard type for the clock only (not
contributed): that is how ``mask`` and ``auto`` see a straggler recover. A fast group that
``ksync`` defers (K below the groups that are not stragglers) does not probe: what was last
measured of it stands.

What a measurement is made of, and how groups sharing cores are priced:
:mod:`unbroken.runtime.syncmeasure`.

A new generation (a failure re-plan, an admission) resets this state on every member at its
settle (a joiner has no history), and the next boundaries rebuild it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import torch

from unbroken.core.ledger import DivergenceError
from unbroken.core.rectlr import WipeOut
from unbroken.core.sync import (AUTO_MODES, MAX_STALENESS, RUNTIME_MODES, AsyncStep,
                                AutoState, CostModel, Job, KsyncStep, NoiseScale,
                                bench_for_mode, data_step_losses, decide, drain_step,
                                flag_stragglers, ksync_step, mask_bench, parse_mode,
                                split_times)
from unbroken.events import Event
from unbroken.runtime import stepbuf as sb
from unbroken.runtime.background import Background, Result
from unbroken.runtime.resources import runqueue_wait
from unbroken.runtime.stacked import StackedRunner
from unbroken.runtime.syncmeasure import (BLOCKED_WINDOW, PROBE, WINDOW, Measure, Spent, clock,
                                          spent)
from unbroken.runtime.syncstreams import Streams

__all__ = ["ModeRunner", "make_runner", "WINDOW", "BLOCKED_WINDOW", "PROBE", "AUTO_MODES"]


class _CatchUp(NamedTuple):
    """A ksync step's deferred shards this group computed: their summed gradient (None: none
    of them), how many, {catch-up index: its loss} and what they cost."""

    step: int
    grad: torch.Tensor | None
    shards: int
    losses: dict[int, float]
    spent: Spent


def make_runner(cfg: Any, *args: Any, **kw: Any) -> StackedRunner:
    """The runner for ``cfg.sync``: the plain :class:`StackedRunner` for ``sync``."""
    return (StackedRunner if getattr(cfg, "sync", "sync") == "sync" else ModeRunner)(
        cfg, *args, **kw)


class ModeRunner(Measure, Streams, StackedRunner):
    """:class:`StackedRunner` with ``mask`` / ``auto`` decisions at every step boundary
    (measuring: :class:`~unbroken.runtime.syncmeasure.Measure`; groups/async:
    :class:`~unbroken.runtime.syncstreams.Streams`)."""

    def __init__(self, cfg: Any, uid: int, comm: Any,
                 journal: Callable[[dict], None] = lambda e: None, **kw: Any) -> None:
        mode = parse_mode(cfg.sync, cfg.groups)
        if mode.name not in RUNTIME_MODES:
            raise ValueError(f"--sync {cfg.sync}: not built in the runtime (built: "
                             f"{', '.join(RUNTIME_MODES)})")
        self.sync_mode, self.k = mode.name, mode.k
        n = cfg.groups
        self._bg = mode.name in ("groups", "async")
        # catch-up cells: ksync's backlog stays under 2N; groups/async drain up to every
        # group's lag (MAX_STALENESS) and in-flight shard at once, plus the backlog
        self._cap = n * (2 * MAX_STALENESS + 4) if self._bg else 2 * n
        self.cursor = [0] * n                   # groups/async: each stream's next data step
        self.inflight: dict[int, Job] = {}      # groups/async: the background jobs, any group
        self._ready: tuple[int, ...] = ()       # clusters' members done at the last commit
        self._ap: tuple[int, AsyncStep] | None = None   # (step, its groups/async plan)
        self._dv: tuple[int, Result | None, bool] | None = None  # (step, my delivery, ready)
        self._work = Background()
        self._t_boundary = time.perf_counter()
        self._settling = False
        self.backlog: list[tuple[int, int]] = []  # ksync: deferred (data step, type), oldest first
        # data steps with deferred shards: their loss sum and shards so far (the fair loss)
        self.pending_loss: dict[int, tuple[float, int]] = {}
        self._dl: tuple[int, dict[int, float]] | None = None  # (step, data steps it completed)
        self._ks: tuple[int, KsyncStep, dict] | None = None  # (step, plan, deferred {type: slot})
        self._extra: _CatchUp | None = None   # my catch-up of deferred shards
        self._outer_journal = journal
        self._off = n + (n * n if cfg.sdc_every > 0 else 0)  # the region, from the gradient's end
        self.cost = CostModel(shard_batch=cfg.shard_size, redundancy=cfg.redundancy,
                              cores=cfg.host_cores)
        self._choose = None  # auto's chooser: the heuristic, or STAR's ML selector (--selector)
        if cfg.selector is not None:
            from unbroken.runtime.mlselector import load_selector

            self._choose = load_selector(cfg.selector).chooser()
        self._reset_modes()
        super().__init__(cfg, uid, comm, self._journal, **kw)

    # ------------------------------------------------------------------ state
    def _reset_modes(self) -> None:
        # per group its last WINDOW measured per-shard times on a core of its own, as (on a
        # core, blocked) (core.sync.split_times): measurements, not steps, so a group left
        # out keeps what was last measured of it until a probe says more
        self.hist: list[list[tuple[float, float]]] = [[] for _ in self.cursor]
        self._qs: tuple[int, float] | None = None  # (step, my own shards' run-queue wait)
        self.slow: tuple[int, ...] = ()   # the groups predicted stragglers: they probe
        self.bench: tuple[int, ...] = ()
        self._replan = False              # the plan came from a settle: set ours again
        self.auto = AutoState()
        self.noise = NoiseScale()
        self.effective = "sync"           # the mode of the steps now: sync, or mask (benched)
        self._probe: tuple[int, Spent] | None = None  # (step, what computing a probe cost)
        self._flagged_by: tuple[int, list[float]] | None = None  # (step, the times that
        #                                 flagged self.slow for it): a probe's commit says why
        self._sq: tuple[int, float] | None = None      # (step, |g_type|^2)
        self._rec: tuple[int, dict] | None = None      # (step, groups/async commit fields)

    def _journal(self, ev: dict) -> None:
        if ev.get("event") == Event.COMMIT:
            ev["sync"] = self.effective
            ev["bench"] = list(self.bench)
            ks = self._ks
            if ks is not None and ks[0] == ev["step"]:
                # the ledger: deferred shards of this step, and earlier ones used by it
                ev["deferred"] = sorted(int(t) for t in ks[2])
                ev["catch_up"] = [[s, t, self._uid_of(w, self.op_members)]
                                  for w, s, t in ks[1].catch_up]
                # the loss comparable with sync's: data steps whose N shards are now all
                # computed (see core.sync.data_step_losses); their TTA point is this commit
                if self._dl is not None and self._dl[0] == ev["step"]:
                    ev["data_losses"] = [[s, v] for s, v in sorted(self._dl[1].items())]
            rec = self._rec
            if rec is not None and rec[0] == ev["step"]:
                ev.update(rec[1])
            if self._probe is not None and self._probe[0] == ev["step"]:
                ev["probe_s"] = round(self._probe[1].wall, 6)  # left out, computed for the clock
                fb = self._flagged_by
                if fb is not None and fb[0] == ev["step"]:  # the prediction that flagged it
                    ev["probe_times"] = [round(float(t), 6) for t in fb[1]]
        self._outer_journal(ev)

    def _buflen(self) -> int:
        # time and |g|^2 per group, a coverage cell and a loss cell per caught-up shard (up to
        # _cap each), under groups/async four cells per group (_cells), and the CPU seconds
        # per shard of each group (_cpu_cells) and its run-queue wait per shard (_wait_cells)
        return super()._buflen() + 4 * self.cfg.groups + 2 * self._cap + \
            (4 * self.cfg.groups if self._bg else 0)

    def _cells(self) -> int:
        """Offset (from the gradient's end) of the groups/async cells: per group the data step
        + 1 of the shard it delivers (0: none), its parameter step + 1, 'done, holding' (a
        cluster's members wait for each other) and its loss."""
        return self._off + 2 * self.cfg.groups + 2 * self._cap

    def _meta(self) -> dict:
        return {**super()._meta(), "backlog": [list(b) for b in self.backlog],
                "pending_loss": [[s, v, c] for s, (v, c) in sorted(self.pending_loss.items())],
                "cursor": list(self.cursor),
                "inflight": [[w, j.version, j.data_step, list(j.unit)]
                             for w, j in sorted(self.inflight.items())]}

    def _ks_now(self) -> tuple[int, KsyncStep, dict] | None:
        ks = self._ks
        return ks if ks is not None and ks[0] == self.step else None

    def _ap_now(self, step: int | None = None) -> AsyncStep | None:
        ap = self._ap
        return ap[1] if ap is not None and ap[0] == (self.step if step is None else step) \
            else None

    def _dv_now(self) -> tuple[int, Result | None, bool] | None:
        dv = self._dv
        return dv if dv is not None and dv[0] == self.step else None

    def run(self) -> torch.Tensor:
        try:
            return super().run()
        finally:  # an abandoned job's thread ends before the runner does
            self._work.abandon(join=True)

    # ------------------------------------------------------------------ the step
    def _ensure_grads(self) -> None:
        q0 = runqueue_wait()
        super()._ensure_grads()
        k, slot = self.step, self.my_slot
        q1 = runqueue_wait()
        if q0 is not None and q1 is not None:  # beside compute_s: one step's, summed
            self._qs = (k, (self._qs[1] if self._qs is not None and self._qs[0] == k
                            else 0.0) + q1 - q0)
        ks = self._ks_now()
        if ks is not None and ks[1].catch_up and (self._extra is None or self._extra.step != k) \
                and self.step_error is None:
            start, acc, n_cu, losses = clock(), None, 0, {}
            own_loss = dict(self.trainer.last_loss)  # the step's loss is its own shards'
            for j, (w, s, t) in enumerate(ks[1].catch_up):
                if w == slot:  # a deferred shard, on today's parameters
                    g = self.trainer.grad(s, t)
                    acc = g.clone() if acc is None else acc.add_(g)
                    n_cu += 1
                    losses[j] = self.trainer.last_loss.get(t, float("nan"))
            self.trainer.last_loss.clear()
            self.trainer.last_loss.update(own_loss)
            self._extra = _CatchUp(k, acc, n_cu, losses, spent(start))
        mine = self.contrib.get(slot, ())
        if mine:
            if (self._sq is None or self._sq[0] != k) and mine[0] in self.grads \
                    and self.step_error is None:
                g = self.grads[mine[0]]
                self._sq = (k, float(torch.dot(g, g)))
        elif self._bg:
            self._bg_prepare()
        elif k % PROBE == 0 and slot in self.slow \
                and (self._probe is None or self._probe[0] != k) and self.step_error is None:
            # benched: the own shard type for the clock only (not contributed)
            start = clock()
            self.trainer.grad(k, self.layout.stack(slot)[0])
            self._probe = (k, spent(start))


    def _wait_cells(self) -> int:
        """Offset (from the gradient's end) of the run-queue wait per shard cells, one a
        group, each group's value + 1 (0: unknown; the buffer starts at 0)."""
        return self._cpu_cells() + self.cfg.groups

    def _cpu_cells(self) -> int:
        """Offset (from the gradient's end) of the CPU seconds per shard cells, one a group."""
        return self._cells() + (4 * self.cfg.groups if self._bg else 0)

    def _pack(self) -> torch.Tensor:
        buf = super()._pack()
        base, n, w = self.trainer.numel + self._off, self.cfg.groups, self.my_slot
        wall, cpu, wait = self._own_measure()
        buf[base + w] = wall
        buf[self.trainer.numel + self._cpu_cells() + w] = cpu
        buf[self.trainer.numel + self._wait_cells() + w] = wait + 1.0
        if self._sq is not None and self._sq[0] == self.step:
            buf[base + n + w] = self._sq[1]
        ks = self._ks_now()
        if ks is not None and self.step_error is None:
            ex = self._extra
            if ex is not None and ex.step == self.step and ex.grad is not None:
                buf[:self.trainer.numel].add_(ex.grad)
            for j, (g, _s, _t) in enumerate(ks[1].catch_up):
                if g == w:
                    buf[base + 2 * n + j] = 1.0
                    if ex is not None and ex.step == self.step:
                        buf[base + 2 * n + self._cap + j] = ex.losses.get(j, float("nan"))
        dv = self._dv_now()
        if dv is not None and self.step_error is None:
            cells = self.trainer.numel + self._cells()
            res = dv[1]
            if res is not None:  # my background gradient, into this step's sum
                buf[:self.trainer.numel].add_(res.grad)
                buf[cells + w] = res.job.data_step + 1.0
                buf[cells + n + w] = res.job.version + 1.0
                buf[cells + 3 * n + w] = res.loss
                if res.job.data_step == self.step:  # this step's own shard of my type
                    buf[self.trainer.numel + w] += 1.0
            elif dv[2]:
                buf[cells + 2 * n + w] = 1.0
        return buf

    def _settle(self, members: list[int], *, planned: bool, restart: bool = False) -> bool:
        joiner = self.needs_state
        self._settling = True  # no background delivery is waited for: it will be abandoned
        try:
            ok = super()._settle(members, planned=planned, restart=restart)
        finally:
            self._settling = False
        if ok:  # a new generation: every member starts over (a joiner has no history)
            self._reset_modes()
            self._replan = True
            # the step goes on under the runtime's plan: nothing deferred (the backlog is
            # kept: it is the exactly-once state; a joiner gets it with the state copy)
            self._ks, self._extra = None, None
            if joiner and self.snap is not None and self.snap.meta is not None:
                meta = self.snap.meta
                self.backlog = [(int(s), int(t)) for s, t in meta.get("backlog", [])]
                self.pending_loss = {int(s): (float(v), int(c))
                                     for s, v, c in meta.get("pending_loss", [])}
                self.cursor = [int(c) for c in meta.get("cursor", self.cursor)]
                self.inflight = {int(w): Job(int(v), int(s), tuple(int(g) for g in u))
                                 for w, v, s, u in meta.get("inflight", [])}
            if self._bg:  # background work is abandoned: its shards to the backlog
                self._abandon(self.step)
            # ... except for what was deferred: whoever is live now catches it up in this
            # step (the interrupted step may have been the last one to)
            self._drain(self.step, self.live_slots(self.comm.members), "re-plan")
        return ok

    def _commit(self, buf: torch.Tensor, rolled: bool = False) -> None:
        n = self.cfg.groups
        ks = self._ks_now()
        orig = buf
        if self._ap_now() is not None:
            buf = self._commit_async(buf, rolled)
        elif ks is not None:
            # deferred types are 0 in the sum by the shared plan: they count as covered; each
            # caught-up shard's cell must read 1; the update is the mean over the shards used
            nm, base = self.trainer.numel, self.trainer.numel + self._off
            rest = self._check_region(buf)
            cu = ks[1].catch_up
            cells = rest[self._off + 2 * n:self._off + 2 * n + len(cu)]
            if any(rest[t] != 0.0 for t in ks[2]) or any(c != 1.0 for c in cells):
                raise DivergenceError(
                    f"step {self.step}: ksync coverage: deferred {sorted(ks[2])} read "
                    f"{[rest[t] for t in sorted(ks[2])]}, caught-up cells {cells}")
            lo = self._off + 2 * n + self._cap
            cu_loss = rest[lo:lo + len(cu)]
            done, self.pending_loss = data_step_losses(
                self.pending_loss, self.step, rest[sb.LOSS], n - len(ks[2]),
                [(s, v) for (_w, s, _t), v in zip(cu, cu_loss)], n)
            self._dl = (self.step, done)
            used = n - len(ks[2]) + len(cu)
            buf = buf.clone()
            if used != n:
                buf[:nm].mul_(n / used)
            for t in ks[2]:
                buf[nm + t] = 1.0
            if ks[2]:  # the journal's loss: the mean over the shards of this step computed
                buf[sb.LOSS] = buf[sb.LOSS] * n / (n - len(ks[2]))
            for j in range(len(cu)):
                buf[base + 2 * n + j] = 0.0
        super()._commit(buf, rolled)
        if self._bg and self._ap_now(self.step - 1) is None:
            # the runtime's plan (a settle, a failure plan, the last step) computed the step
            self.cursor = [max(c, self.step) for c in self.cursor]
        if ks is not None or buf is not orig:
            self.last_buf = orig  # a roll-forward re-commits the sum, not the scaled copy
        if ks is not None:
            done = {(s, t) for _w, s, t in ks[1].catch_up}
            self.backlog = [b for b in self.backlog if b not in done] + \
                [(self.step - 1, t) for t in sorted(ks[2])]
        rest = self._check_region(buf)
        times = rest[self._off:self._off + n]
        sqs = [v for v in rest[self._off + n:self._off + 2 * n] if v > 0]
        live = set(self.live_slots(self.op_members))
        cpus = rest[self._cpu_cells():self._cpu_cells() + n]
        waits = [q - 1.0 for q in rest[self._wait_cells():self._wait_cells() + n]]
        on, off = split_times([t if w in live else 0.0 for w, t in enumerate(times)], cpus,
                              waits, self.cost)
        for w, t in enumerate(on):
            if t > 0:
                self.hist[w] = (self.hist[w] + [(t, off[w])])[-WINDOW:]
        if sqs:
            mean_g = self._grad_norm(buf) / n  # the reduced sum's norm / N: the mean gradient
            self.noise.update(sqs, self.cfg.shard_size, mean_g * mean_g,
                              n * self.cfg.shard_size)
        self._decide(self.step, live)

    # ------------------------------------------------------------------ the decision
    def _decide(self, step: int, live: set[int]) -> None:
        """The plan for step ``step`` (the next one), the same on every member."""
        if len(live) < self.cfg.groups:  # a failure plan is in force: the runtime's, not
            # ours; what is deferred is caught up by the live groups now
            self._drain(step, live, "failure plan in force")
            return
        if self._bg:
            self._decide_bg(step, live)
            return
        pred = self._predict()
        # who probes while computing nothing of its own: a predicted straggler (it stays one
        # until within 10 % of the fastest), not a fast group ksync defers
        self.slow = () if pred is None else \
            flag_stragglers(pred, self.cost.straggler_ratio, self.slow)
        self._flagged_by = None if pred is None else (step, pred)  # a fresh list a step
        if self.sync_mode == "ksync":
            self._decide_ksync(step, pred, live, self.k)
            return
        if pred is None:
            want, why = (), "no prediction yet"
        elif self.sync_mode == "mask":
            want, why = mask_bench(pred, self.bench, self.cost)
        else:
            phi = self.noise.phi
            # ksync priced as run here: deferral, nothing stale (core.sync.ksync_defer_estimate)
            cm = CostModel.for_runtime(self.cfg.shard_size, self.cfg.redundancy,
                                       noise_scale=max(0.0, phi) if phi is not None else 0.0,
                                       cores=self.cost.cores)
            d = decide(self.auto, pred, cm, allowed=AUTO_MODES, greedy_mask=True,
                       choose=self._choose)
            if d.switched:
                self.journal({"event": Event.MODE_SWITCH, "step": step, "from": self.auto.mode,
                              "to": d.mode, "reason": d.reason,
                              "predicted": {k: round(v, 6) for k, v in
                                            (d.selection.tta() if d.selection else {}).items()},
                              "times": [round(t, 6) for t in pred], "noise_scale": phi,
                              **({"cores": cm.cores} if cm.cores else {}),
                              "t": time.time()})
            self.auto = d.state
            if d.mode.startswith("ksync"):
                self._decide_ksync(step, pred, live, parse_mode(d.mode, self.cfg.groups).k)
                return
            want, why = bench_for_mode(d, self.bench), d.reason
        if want != self.bench or self._replan:
            self._replan = False
            d = self._fresh_plan(sorted(set(live) - set(want)))
            if isinstance(d, WipeOut):  # cannot leave them out (mask_bench checked; defensive)
                want, d = (), self._fresh_plan(sorted(live))
            self.stacks, self.depth, self.contrib = d.stacks, d.depth, d.contributions()
            self.bench = tuple(want)
            self.effective = "mask" if want else "sync"
            self.journal({"event": Event.BENCH, "step": step, "bench": list(want),
                          "reason": why, "depth": d.depth, "t": time.time()})
        # auto left ksync: its backlog is caught up in this step by the groups computing
        self._drain(step, set(live) - set(self.bench), "auto left ksync")

    def _drain(self, step: int, over: Any, why: str) -> None:
        """Step ``step`` catches up the whole backlog over the groups ``over`` (if any)."""
        if self.backlog:
            ks = drain_step(self.backlog, sorted(over), f"step {step}: {why}")
            if len(ks.catch_up) > self._cap:  # the step buffer has cells for _cap of them
                raise RuntimeError(f"step {step}: {len(ks.catch_up)} shards to catch up, the "
                                   f"step buffer holds {self._cap}")
            self._ks = (step, ks, {})
            self.journal({"event": Event.BENCH, "step": step, "bench": list(self.bench),
                          "reason": ks.reason, "depth": self.depth, "t": time.time()})

    def _decide_ksync(self, step: int, pred: list[float] | None, live: set[int],
                      k: int) -> None:
        ks = ksync_step(pred, self.cfg.groups, k, self.backlog,
                        last=step == self.cfg.steps - 1)
        full = self._fresh_plan(sorted(live))
        contrib = full.contributions()
        deferred = {t: w for w in ks.late for t in contrib.get(w, ())}
        self.stacks, self.depth = full.stacks, full.depth
        self.contrib = {w: ts for w, ts in contrib.items() if w not in ks.late}
        self._ks = (step, ks, deferred)
        # the next plan that is not ksync's is made afresh: this one leaves the late out
        self._replan = True
        if tuple(ks.late) != self.bench:
            self.journal({"event": Event.BENCH, "step": step, "bench": list(ks.late),
                          "reason": ks.reason, "depth": full.depth, "t": time.time()})
        self.bench = tuple(ks.late)
        self.effective = f"ksync:{k}" if (ks.late or ks.catch_up) else "sync"


