"""Stacked data-parallel training step that masks a dead group without a restart.

The step, on each live group (one process per group here)
---------------------------------------------------------
1. Compute the gradient of every shard type the current plan assigns to this group (at first
   ``assignment[t] = t``, depth 1: plain data parallelism), keeping one buffer *per type* for
   the current step, so a later re-plan can re-sum without recomputing.
2. Sum the assigned types into one flat float64 buffer, append an in-band check (one 1.0 per
   contributed type at that type's slot, the loss, rank 0's view of pending joiners, a
   "coordinator lost" flag, the member count and the step), and ``FTComm.allreduce`` it.
3. True: the in-band check must read "every type exactly once, every member at this step";
   then grad = sum / N, optimizer step, one journal line with the contributions (the ledger),
   and every ``ckpt_every`` steps rank 0 starts a durable checkpoint in the background.
4. False: ``FTComm.reform()`` gives the new members. They first exchange their step numbers
   (with the rendezvous: each member offers its report before it joins, and the leader
   publishes them all with the member list, so no collective is spent on it; a communicator
   without that gets one all-reduce): a member that saw a completed all-reduce fail while
   its peers committed is one step
   behind and is *rolled forward* with a peer's reduced buffer. Then every survivor calls the
   pure ``rectlr.decide(layout, live, stacks, depth, computed)`` with the same inputs (what
   each group computed this step follows from the plans, which every survivor knows), so all
   get the same plan without a coordinator round trip. Each survivor computes its ``patch``
   types, re-sums exactly its newly assigned types and retries; loop until commit.
5. A :class:`~unbroken.core.rectlr.WipeOut`: the survivors keep their committed state, wait
   for replacements of the dead slots, and admit them (below); :class:`WipeOutError` if none
   come.

The every-step in-memory checkpoint (ByteRobust keeps one per step, backed up outside the own
parallel group) is here the committed state every live group holds: data parallelism
replicates it, and a member applies the optimizer step only at a commit, so after any failed op
its live state *is* the last committed step, held by every survivor, outside the failed
groups by construction. A separate copy per step protected nothing these replicas do not (it
lived in the same process) and cost a full state copy every step. A checksummed snapshot is
taken when it is sent: the state copy to a joiner (admission or wipe-out restart).

Spares: a warm spare posts a join record; rank 0 reports the count in the buffer, so all
members admit it at the same step boundary: a new generation with the joiner, a snapshot of
the committed state broadcast from a member (sha256-verified by the joiner; a bad copy is
refused and the next member's used), and a fresh plan (depth 1 once every slot is live again).
Identity: ``uid`` is the process, ``slot`` its place in the layout; a spare takes over a dead
slot under a new uid.

This module is the step (the loop, the buffer it packs, the commit, checkpoint and resume);
the buffer's layout is :mod:`~unbroken.runtime.stepbuf`, the settle of a new generation
:mod:`~unbroken.runtime.recovery`, what a bad step leads to :mod:`~unbroken.runtime.incidents`,
admission and wipe-out :mod:`~unbroken.runtime.admission` (mixed into the runner: they share
its state, each file holds one concern).

The data plan (:mod:`unbroken.core.shards`) is a pure function of (seed, step, type), so any
group can compute any shard, and the data position is the step: exactly-once holds across
restarts (a ``restore`` event rolls the ledger back).

Known limits
------------
* A failure in the middle of an admission is handled by the next all-reduce failing, but a
  joiner whose state copy broke exits (the launcher must send another).
* The state copy goes from one old member to the joiners point to point; a bad copy moves to
  the next old member, one at a time (a copy per joiner from different sources would spread
  the load at many joiners).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from unbroken.core.placement import make_layout
from unbroken.core.rectlr import decide, initial_stacks
from unbroken.core.replay import sdc_check_due
from unbroken.events import Event
from unbroken.protocol import CODE_COUNT, JOIN_COUNT, STOP_KEY
from unbroken.runtime import stepbuf as sb
from unbroken.runtime.admission import Admission, WipeOutError
from unbroken.runtime.comm import CommLike
from unbroken.runtime.config import TrainConfig
from unbroken.runtime.groupsync import GroupSync, is_group_error
from unbroken.runtime.hooks import NoHooks, StepHooks
from unbroken.runtime.incidents import GuardStopError, Incidents
from unbroken.runtime.recovery import Recovery
from unbroken.core.ledger import DivergenceError
from unbroken.runtime.resources import IoCounter, ring_rx_bytes
from unbroken.runtime.stepbuf import joins_reported
from unbroken.runtime.trainer import TrainerLike, copy_state, grad_into, make_trainer

__all__ = ["WipeOutError", "DivergenceError", "CoordinatorLostError", "StopRequested",
           "StackedRunner", "GuardStopError", "joins_reported"]


#: the store counters rank 0 reads into every step's buffer (see ``_control``)
_CONTROL = (JOIN_COUNT, CODE_COUNT, STOP_KEY)


class CoordinatorLostError(RuntimeError):
    """The coordinator's store is gone: every member stopped after the same committed step."""


class StopRequested(RuntimeError):
    """The supervisor asked the job to stop (SIGINT/SIGTERM): every member stopped after the
    same committed step."""


class StackedRunner(Recovery, Incidents, Admission):
    """Runs stacked data-parallel steps on one group over an ``FTComm`` until ``cfg.steps``.

    Identity: ``uid`` is the process (FTComm member), ``slot`` its place in the layout; a spare
    that replaces a dead group takes over its slot under a new uid. ``journal(obj)`` receives
    one dict per event: ``commit`` (``step, gen, members, mine, plan{type: uid}, loss``, and
    the group's own time and resource signals ``own_s, cpu, tx_bytes, rx_bytes``), ``replan``,
    ``roll_forward``, ``wipeout``, ``admit``, ``restart``, ``fault``.
    """

    def __init__(self, cfg: TrainConfig, uid: int, comm: CommLike,
                 journal: Callable[[dict], None] = lambda e: None,
                 hooks: StepHooks | None = None,
                 slot: int | None = None, wipeout_wait: float = 60.0,
                 ckpt_dir: str | None = None, ckpt_every: int = 50,
                 trainer: TrainerLike | None = None, verdicts: bool = False,
                 verdict_wait: float = 60.0, group: GroupSync | None = None) -> None:
        self.cfg = cfg
        # a group of several ranks: its ranks agree on every step's outcome and generation
        # (None: the group is this one process)
        self.group = group
        # verdicts=True: a bad step check (a step error, a non-finite sum, an SDC mismatch)
        # waits for the guard's ladder decision (store ``verdict/<step>/<n>``); False: the
        # incident is journaled and the step goes on as without a guard (log-only)
        self.verdicts, self.verdict_wait = verdicts, verdict_wait
        # incidents so far (the verdict key's n): never reset, so a step recomputed after a
        # roll-back keys new incidents apart from the answered ones of its first pass (a reset
        # per step re-read the old verdicts and replayed / restored forever); a joiner takes
        # the count with the state
        self.incidents = 0
        self.code_applied = 0   # code records ``code/<n>`` applied (hot updates, rollbacks)
        self.version = "v0"
        self.step_error: str | None = None
        self.uid = uid
        self.comm = comm
        self.journal = journal
        self.hooks = hooks or NoHooks()
        self.wipeout_wait = wipeout_wait
        self.layout = make_layout(cfg.groups, cfg.redundancy)
        self.dev = torch.device(cfg.device)
        self.trainer = self.hooks.wrap_trainer(
            self, trainer if trainer is not None else make_trainer(cfg))
        self.slot_of: dict[int, int] = {w: w for w in range(cfg.groups)}
        if slot is not None:
            self.slot_of[uid] = slot
        self.admitted = 0    # join records (store ``join/<n>``) dealt with so far
        self.join_seen = 0   # join count seen by the last committed step's rank 0
        self._control_ready = False
        if hasattr(comm, "watch"):  # every member: whoever is rank 0 later has fresh values
            comm.watch(_CONTROL)
            self._control_ready = True
        self._norm: tuple[torch.Tensor, float] | None = None  # (buffer, its gradient norm)
        # (step, type, buffer): this step's all-reduce buffer with the group's one
        # contributed type computed straight into it (see _ensure_grads)
        self._prepared: tuple[int, int, torch.Tensor] | None = None
        self._plan_cache: tuple[dict, list, dict[str, int]] | None = None  # _plan_record
        self._region: tuple[torch.Tensor, list[float]] | None = None  # (buffer, _check_region)
        d = self._fresh_plan(list(range(cfg.groups)))
        self.stacks, self.depth, self.contrib = d.stacks, d.depth, d.contributions()
        self.plan_gen = 0       # the generation whose settle decided the plan (0: the start)
        self.needs_state = False  # a joiner until the settle has copied the state to it
        self.step = 0
        self.grads: dict[int, torch.Tensor] = {}
        self.grads_step = -1
        self.compute_s, self.compute_n = 0.0, 0
        self.cpu_s = 0.0  # the main thread's CPU time in compute_s (CPU availability)
        self._io = IoCounter()  # bytes sent, per commit (see unbroken.runtime.resources)
        self._sent = self._io.sent()
        self.computed: dict[int, set[int]] = {}
        self.last_buf: torch.Tensor | None = None
        self.op_members: list[int] = list(comm.members)  # the generation of the last step op
        self.ckpt = None
        self.ckpt_every = max(1, int(ckpt_every))
        if ckpt_dir is not None:
            from unbroken.runtime.checkpoint import CheckpointStore

            self.ckpt = CheckpointStore(ckpt_dir, log=lambda msg: self.journal(
                {"event": Event.CHECKPOINT_WARNING, "message": msg, "t": time.time()}),
                on_saved=lambda step, path: self.journal(  # the guard restores only these
                    {"event": Event.CHECKPOINT, "step": step, "path": path, "t": time.time()}))
        self._snap = None  # the state-copy buffer, made at the first copy (see the docstring)

    # ------------------------------------------------------------------ helpers
    @property
    def my_slot(self) -> int:
        return self.slot_of[self.uid]

    def live_slots(self, members: list[int] | None = None) -> list[int]:
        return sorted(self.slot_of[u] for u in (members or self.comm.members))

    def _meta(self) -> dict:
        return {"step": self.step, "slot_of": {str(u): s for u, s in self.slot_of.items()},
                "admitted": self.admitted, "code": self.code_applied,
                "incidents": self.incidents}

    def _buflen(self) -> int:
        return sb.buflen(self.trainer.numel, self.cfg.groups, self.cfg.sdc_every > 0)

    def _check_step(self) -> bool:
        return sdc_check_due(self.step, self.cfg.sdc_every)

    def _hosted(self) -> list[int]:
        """The shard types this group's slot hosts (its full stack in the layout)."""
        return list(self.layout.stack(self.my_slot))

    def _fresh_plan(self, live: list[int]):
        """The plan for ``live`` slots from the original stacks, as at a step boundary (the
        start, an admission): plain data parallelism when every slot is live."""
        return decide(self.layout, live, initial_stacks(self.layout), 1,
                      computed={w: [] for w in live})

    def _ensure_grads(self) -> None:
        """Gradients of this group's assigned types for the current step (kept per type, so a
        re-plan can re-sum without recomputing)."""
        if self.grads_step != self.step:
            self.grads, self.grads_step = {}, self.step
            self.computed = {w: set(ts) for w, ts in self.contrib.items()}
            self.compute_s, self.compute_n, self.cpu_s = 0.0, 0, 0.0
            self.step_error = None
        t0, c0 = time.perf_counter(), time.thread_time()
        contrib = list(self.contrib.get(self.my_slot, ()))
        mine = list(contrib)
        if self._check_step():  # the redundant check: the other hosted types, digests only
            mine += [t for t in self._hosted() if t not in mine]
        for t in mine:
            if t not in self.grads and self.step_error is None:
                out = None
                if contrib == [t] and self.group is None:
                    # the group's only contribution: compute it where the all-reduce will sum
                    # it (plain data parallelism's zero-copy step). Not for a group of ranks:
                    # the buffer goes with a broken op, and computing the gradient again is a
                    # forward and backward with the group's own collectives (FSDP's), most of
                    # an R = 2 recovery's replan on 2 cores; a copy of this rank's shard of
                    # the gradient into the buffer costs far less a step
                    buf = torch.empty(self._buflen(), dtype=torch.float64, device=self.dev)
                    out = buf[:self.trainer.numel]
                    self._prepared = (self.step, t, buf)
                try:
                    self.grads[t] = grad_into(self.trainer, self.step, t, out)
                except Exception as exc:  # the training code failed: every member must hear
                    self._step_failed(exc)  # of it in-band, or the others wait in the collective
                    break
                self.compute_n += 1
        # the group's own compute per shard: what fail-slow detection compares across peers
        # (commit times cannot show it: a synchronous step waits for the slowest group; per
        # shard, so a survivor computing a stack of two after a masked failure is not "slow")
        # the CPU interval nested in the wall one (read first, stopped first): the CPU
        # availability cpu_s / compute_s cannot read above 1 by the order of the reads
        self.cpu_s += time.thread_time() - c0
        self.compute_s += time.perf_counter() - t0

    def _reform_phases(self) -> dict:
        """When this member noticed the failure and how long the new generation's rendezvous
        and process group took (the communicator's last ``reform`` record; {} without one)."""
        rec = next((e for e in reversed(getattr(self.comm, "journal", None) or [])
                    if e.get("event") == Event.REFORM), None)
        if rec is None or rec.get("gen") != self.comm.generation:
            return {}
        return {k: rec[k] for k in ("detected_at", "rendezvous_s", "pg_init_s") if k in rec}

    def _step_failed(self, exc: BaseException) -> None:
        import traceback

        if self.group is not None and is_group_error(exc):  # a sibling rank is gone, not a
            self.group.broken(self.comm, exc)               # bug: the group is fenced

        self.step_error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.journal({"event": Event.STEP_ERROR, "step": self.step, "version": self.version,
                      "error": self.step_error[-500:],
                      "where": traceback.format_exc(limit=-3)[-1500:], "t": time.time()})

    def _pack(self) -> torch.Tensor:
        """The step's all-reduce buffer: the summed gradient of this group's types, then the
        in-band check (coverage, digests, the tail), written in one assignment: element-wise
        writes into a tensor cost microseconds each, on every step."""
        tr, n = self.trainer, self.cfg.groups
        mine = () if self.step_error is not None else self.contrib.get(self.my_slot, ())
        prep = self._prepared
        if prep is not None and prep[0] == self.step and list(mine) == [prep[1]] \
                and prep[1] in self.grads and self.grads[prep[1]].data_ptr() == prep[2].data_ptr():
            buf = prep[2]  # the gradient is in place already
            mine_copy: tuple = ()
        else:
            buf = torch.empty(self._buflen(), dtype=torch.float64, device=self.dev)
            mine_copy = tuple(mine)
        g = buf[:tr.numel]
        rest = [0.0] * (buf.numel() - tr.numel)  # coverage, digests, tail (negative indices)
        if self.step_error is not None:
            rest[sb.ERR] = 1.0  # contributes nothing; every member sees the error at the commit
        for i, t in enumerate(mine_copy):
            if i == 0:
                g.copy_(self.grads[t])
            else:
                g.add_(self.grads[t])
        for t in mine:
            rest[t] += 1.0
            rest[sb.LOSS] += tr.last_loss.get(t, float("nan"))
        if not mine:
            g.zero_()
        if self._check_step() and self.step_error is None:
            for t in self._hosted():
                if t in self.grads:
                    rest[n + t * n + self.my_slot] = float(sb.digest52(self.grads[t]))
        if self.comm.rank == 0 and not self.comm.store_lost:
            try:  # one observer, so every member sees the same counts
                rest[sb.JOIN], rest[sb.CODE], rest[sb.STOP] = self._control()
            except Exception:
                self.comm.store_lost = True
        # any member that lost the coordinator makes every member stop after this commit
        lost = self.comm.store_lost or getattr(self.comm, "supervisor_lost", False)
        rest[sb.LOST] = 1.0 if lost else 0.0
        rest[sb.COUNT] = 1.0
        rest[sb.STEP] = float(self.step)
        buf[tr.numel:] = torch.tensor(rest, dtype=torch.float64)
        self.op_members = self.comm.members
        return buf

    def _check_region(self, buf: torch.Tensor) -> list[float]:
        """The reduced buffer past the gradient (coverage, digests, tail) as Python floats,
        read once per reduced buffer: the step check and the commit both need it."""
        if self._region is None or self._region[0] is not buf:
            self._region = (buf, buf[self.trainer.numel:].tolist())
        return self._region[1]

    def _control(self) -> tuple[float, float, float]:
        """Rank 0's view of the join count, the code-record count and the supervisor's stop
        request. They change rarely, so the communicator's heartbeat thread reads them (one
        period behind at most) instead of a store round trip on every step's critical path;
        a communicator without ``watch`` is asked directly."""
        if hasattr(self.comm, "watch"):
            if not self._control_ready:
                self.comm.watch(_CONTROL)
                self._control_ready = True
            w = self.comm.watched
            return tuple(float(w.get(k, 0)) for k in _CONTROL)
        st = self.comm.store
        if not self._control_ready:
            for k in _CONTROL:
                st.add(k, 0)
            self._control_ready = True
        return tuple(float(int(v)) for v in st.multi_get(list(_CONTROL)))

    def reattached(self, store) -> None:
        """The communicator moved onto a new coordinator's store (``runtime.reattach``) after
        every member stopped at the same boundary: watch the control counters there, and
        (rank 0, once) carry them on from what this job has applied, so the next join record
        or code record is numbered after the last one dealt with. A join seen but not
        admitted was a spare of the old coordinator's, gone with its store."""
        self.join_seen = self.admitted
        self._control_ready = False
        # one process of the job: the first member's rank 0 (every plane has a member 0)
        if self.comm.rank == 0 and getattr(self.comm, "plane", 0) == 0:
            for key, value in ((JOIN_COUNT, self.admitted), (CODE_COUNT, self.code_applied)):
                have = int(store.add(key, 0))
                if have < value:
                    store.add(key, value - have)

    # ------------------------------------------------------------------ the loop
    def run(self) -> torch.Tensor:
        while self.step < self.cfg.steps:
            self.run_step()
        if self.ckpt is not None:
            self.ckpt.wait()
        return self.trainer.flat_params()

    def run_step(self) -> None:
        if self.join_seen > self.admitted:
            self._admit(self.join_seen)
        self._ensure_grads()
        self.hooks.step_ready(self)
        while True:
            buf = self._pack()
            self.hooks.before_allreduce(self)
            ok = self.comm.allreduce(buf)
            prep = self._prepared
            if prep is not None and prep[2] is buf:
                # the own gradient was reduced in place (or abandoned with a broken op): if
                # the step is computed again, so is it
                self._prepared = None
                self.grads.pop(prep[1], None)
            found = self._step_check(buf) if ok else None
            if self.group is not None:
                ok, found = self.group.agree(self, ok, buf, found)
            if ok:
                if found is None or self._incident(*found):
                    self._commit(buf)
                    return
                self._ensure_grads()  # a verdict: recompute (retry, rollback, restore)
                continue
            self._recover()
            self._ensure_grads()  # rolled forward into the next step, or a fresh plan

    def _commit(self, buf: torch.Tensor, rolled: bool = False) -> None:
        tr, n, k = self.trainer, self.cfg.groups, self.step
        rest = self._check_region(buf)
        count = rest[sb.COUNT]
        if rest[sb.STEP] != k * count:
            raise DivergenceError(
                f"step {k}: members are at different steps (step sum {rest[sb.STEP]}, "
                f"expected {k} x {count:g}): a step was committed by only some members")
        cover = rest[:n]
        if any(c != 1.0 for c in cover):
            raise DivergenceError(
                f"step {k}: shard-type coverage {cover} is not all ones: a type is "
                f"missing from or counted twice in the sum")
        tr.apply(buf[:tr.numel])
        self.last_buf = buf
        self.join_seen = max(self.join_seen, int(rest[sb.JOIN]))
        self.step += 1
        sent, self._sent = self._sent, self._io.sent()
        self.journal({"event": Event.COMMIT, "step": k, "gen": self.comm.generation,
                      "members": self.comm.members,
                      "mine": list(self.contrib.get(self.my_slot, ())),
                      "plan": self._plan_record(),
                      "loss": rest[sb.LOSS] / n, "rolled": rolled,
                      "grad_norm": round(self._grad_norm(buf) / n, 9),
                      "compute_s": round(self.compute_s / max(1, self.compute_n), 6),
                      # resource signals (unbroken.runtime.resources says what each is): the
                      # group's own part of the step, its CPU availability, bytes sent / the
                      # ring model of bytes received
                      "own_s": round(self.compute_s, 6),
                      "cpu": round(self.cpu_s / self.compute_s, 4) if self.compute_s > 0
                      else None,
                      "tx_bytes": None if sent is None or self._sent is None
                      else self._sent - sent,
                      "rx_bytes": ring_rx_bytes(buf.element_size() * buf.numel(),
                                                len(self.op_members)),
                      "t": time.time()})
        if self.ckpt is not None and self.step % self.ckpt_every == 0 \
                and self.comm.rank == 0 and self.step < self.cfg.steps:
            self.ckpt.save_async(self.step, self._ckpt_state(), self._meta(), **self._ckpt_kw())
        if int(rest[sb.CODE]) > self.code_applied:  # a hot update, at the same boundary for all
            self._apply_code(int(rest[sb.CODE]))
        if rest[sb.LOST] > 0:
            raise CoordinatorLostError(
                f"the coordinator's store or the supervisor is gone; stopped after step {k} "
                f"on every member")
        if rest[sb.STOP] > 0:
            raise StopRequested(f"stop requested; stopped after step {k} on every member")

    def _plan_record(self) -> dict[str, int]:
        """Who contributed each type: its holder in the generation the step's op ran in (a
        member rolled forward is already in the next one). The same every step of a plan, so
        made once per (plan, generation): O(N^2) to build at N groups."""
        c = self._plan_cache
        if c is None or c[0] is not self.contrib or c[1] != self.op_members:
            c = self._plan_cache = (self.contrib, list(self.op_members), {
                str(t): self._uid_of(w, self.op_members)
                for w, ts in self.contrib.items() for t in ts})
        return c[2]

    def _grad_norm(self, buf: torch.Tensor) -> float:
        if self._norm is not None and self._norm[0] is buf:
            return self._norm[1]
        return float(buf[:self.trainer.numel].norm())

    def save_checkpoint_now(self) -> str | None:
        """Durable checkpoint of the committed state, written by the generation's rank 0 only
        (the state is a replica on every member). Blocks until it is on disk."""
        if self.ckpt is None or self.comm.rank != 0:
            return None
        fut = self.ckpt.save_async(self.step, self._ckpt_state(), self._meta(),
                                   **self._ckpt_kw())
        self.ckpt.wait()
        return fut.result()

    def resume(self) -> int | None:
        """Load the newest valid durable checkpoint (a corrupt one is skipped with a warning
        and the previous one used); returns its step, or None when there is none."""
        if self.ckpt is None:
            return None
        found = self.ckpt.latest()
        if found is None:  # nothing durable yet: start over, and say so (the ledger rolls back)
            self.journal({"event": Event.RESTORE, "step": 0, "source": "none", "t": time.time()})
            return None
        self._install(*self.ckpt.load(self._ckpt_state(), found[1],
                                      **({"group": self.group.ckpt_pg} if self.group else {})),
                      path=found[1])
        return self.step

    def _ckpt_state(self) -> list[torch.Tensor] | dict[str, torch.Tensor]:
        """What a durable checkpoint holds: the state by name when the trainer names it (a
        checkpoint that loads into any number of ranks a group), else its list."""
        named = getattr(self.trainer, "named_state", None)
        return named() if named is not None else self.trainer.state_tensors()

    def _ckpt_kw(self) -> dict:
        """A group of several ranks saves together: its checkpoint process group, rank 0 the
        coordinator, the directory named after rank 0's pid."""
        g = self.group
        return {} if g is None else {"group": g.ckpt_pg, "coordinator": g.rank == 0,
                                     "tag": g.leader_pid}

    def _install(self, tensors: list[torch.Tensor] | dict[str, torch.Tensor], meta: dict,
                 path: str, reason: str | None = None) -> None:
        """Make a loaded checkpoint the committed state (and its code version the running
        one), then journal the roll-back: commits of steps >= its step no longer count."""
        if isinstance(tensors, dict):
            own = self._ckpt_state()
            copy_state([own[k] for k in tensors], list(tensors.values()))
        else:
            copy_state(self.trainer.state_tensors(), tensors)
        self.step = int(meta["step"])
        self.grads_step = -1
        if int(meta.get("code", 0)) > self.code_applied:
            self._apply_code(int(meta["code"]))
        self.journal({"event": Event.RESTORE, "step": self.step, "source": "checkpoint",
                      "path": str(path), **({"reason": reason} if reason else {}),
                      "t": time.time()})

    def _uid_of(self, slot: int, members: list[int] | None = None) -> int:
        for u in (members or self.comm.members):
            if self.slot_of[u] == slot:
                return u
        return -1
