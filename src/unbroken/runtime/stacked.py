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
4. False: ``FTComm.reform()`` gives the new members. They first exchange their step numbers:
   a member that saw a completed all-reduce fail while its peers committed is one step
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
members admit it at the same step boundary: a new generation with the joiner, a snapshot of the
committed state broadcast from a member (sha256-verified by the joiner; a bad copy is refused
and the next member's used), and a fresh plan (depth 1 once every slot is live again). Identity: ``uid`` is
the process, ``slot`` its place in the layout; a spare takes over a dead slot under a new uid.

The data plan (:mod:`unbroken.core.shards`) is a pure function of (seed, step, type), so any
group can compute any shard, and the data position is the step: exactly-once holds across
restarts (a ``restore`` event rolls the ledger back).

Known limits
------------
* A failure in the middle of an admission is handled by the next all-reduce failing, but a
  joiner whose state copy broke exits (the launcher must send another).
* The state copy is an all-reduce of the whole state (fine for this size, not for 10k groups).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any, Callable

import numpy as np
import torch

from unbroken.core.membership import Report, settle
from unbroken.core.placement import make_layout
from unbroken.core.rectlr import WipeOut, decide, initial_stacks
from unbroken.core.replay import digest_mismatches, sdc_check_due
from unbroken.events import Event
from unbroken.protocol import (CODE_COUNT, JOIN_COUNT, STOP_KEY, admit_key, code_key, dead_key,
                               incident_key, join_key, replay_key, state_key, verdict_key,
                               wipeout_key)
from unbroken.runtime.comm import CommLike
from unbroken.runtime.config import TrainConfig
from unbroken.runtime.ledger import DivergenceError
from unbroken.runtime.trainer import TrainerLike, grad_into, make_trainer

__all__ = ["WipeOutError", "DivergenceError", "CoordinatorLostError", "StopRequested", "StepHooks",
           "StackedRunner", "joins_reported"]


class WipeOutError(RuntimeError):
    """A shard type lost all of its hosts and no replacement came: the step cannot be resumed
    in memory (the supervisor restarts from the durable checkpoint)."""


class StepHooks:
    """Points of a group's step where a test acts (fault injection, see
    :mod:`unbroken.testing.faults`); here every one is a no-op."""

    def wrap_trainer(self, runner: StackedRunner, trainer: TrainerLike) -> TrainerLike:
        """Every trainer the runner steps with (the start, each hot update)."""
        return trainer

    def step_ready(self, runner: StackedRunner) -> None:
        """Once a step: its gradients are computed, its all-reduce not issued yet."""

    def before_allreduce(self, runner: StackedRunner) -> None:
        """Just before each issue of the step's all-reduce (the first and every retry)."""

    def before_patch(self, runner: StackedRunner) -> None:
        """A failure re-plan gave this group patch types; before computing them."""

    def after_replan(self, runner: StackedRunner, plan: Any) -> None:
        """After a failure re-plan is journaled, before the retried op."""

    def state_payload(self, runner: StackedRunner, payload: torch.Tensor) -> torch.Tensor:
        """The snapshot this member serves a joiner (what goes into the state copy)."""
        return payload


# layout of the all-reduce buffer after the gradient: N coverage slots, N*N digest slots
# (type t, slot w) when sdc_every > 0, then these
_STOP, _ERR, _CODE, _LOSS, _JOIN, _LOST, _COUNT, _STEP = range(-8, 0)
_TAIL = 8


def joins_reported(buf: torch.Tensor) -> int:
    """The join count rank 0 reported in a reduced step buffer."""
    return int(buf[_JOIN])


#: the store counters rank 0 reads into every step's buffer (see ``_control``)
_CONTROL = (JOIN_COUNT, CODE_COUNT, STOP_KEY)


class CoordinatorLostError(RuntimeError):
    """The coordinator's store is gone: every member stopped after the same committed step."""


class StopRequested(RuntimeError):
    """The supervisor asked the job to stop (SIGINT/SIGTERM): every member stopped after the
    same committed step."""


class GuardStopError(RuntimeError):
    """The guard's ladder gave up on an incident (exit ``EXIT_NO_PROGRESS``)."""


def digest52(t: torch.Tensor) -> int:
    """A 52-bit digest of a tensor's bytes (never 0: 0 marks "not computed"); exact in a
    float64, so digests travel through the summing all-reduce unchanged."""
    import hashlib

    h = int.from_bytes(hashlib.blake2b(t.detach().cpu().contiguous().numpy().tobytes(),
                                       digest_size=8).digest(), "little") & ((1 << 52) - 1)
    return h or 1


class StackedRunner:
    """Runs stacked data-parallel steps on one group over an ``FTComm`` until ``cfg.steps``.

    Identity: ``uid`` is the process (FTComm member), ``slot`` its place in the layout; a spare
    that replaces a dead group takes over its slot under a new uid. ``journal(obj)`` receives
    one dict per event: ``commit`` (``step, gen, members, mine, plan{type: uid}, loss``),
    ``replan``, ``roll_forward``, ``wipeout``, ``admit``, ``restart``, ``fault``.
    """

    def __init__(self, cfg: TrainConfig, uid: int, comm: CommLike,
                 journal: Callable[[dict], None] = lambda e: None,
                 hooks: StepHooks | None = None,
                 slot: int | None = None, wipeout_wait: float = 60.0,
                 ckpt_dir: str | None = None, ckpt_every: int = 50,
                 trainer: TrainerLike | None = None, verdicts: bool = False,
                 verdict_wait: float = 60.0) -> None:
        self.cfg = cfg
        # verdicts=True: a bad step check (a step error, a non-finite sum, an SDC mismatch)
        # waits for the guard's ladder decision (store ``verdict/<step>/<n>``); False: the
        # incident is journaled and the step goes on as without a guard (log-only)
        self.verdicts, self.verdict_wait = verdicts, verdict_wait
        self.incidents = 0      # incidents at the current step (the verdict key's n)
        self.code_applied = 0   # code records ``code/<n>`` applied (hot updates, rollbacks)
        self.version = "v0"
        self.step_error: str | None = None
        self.uid = uid
        self.comm = comm
        self.journal = journal
        self.hooks = hooks or StepHooks()
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
        self.computed: dict[int, set[int]] = {}
        self.last_buf: torch.Tensor | None = None
        self.op_members: list[int] = list(comm.members)  # the generation of the last step op
        self.ckpt = None
        self.ckpt_every = max(1, int(ckpt_every))
        if ckpt_dir is not None:
            from unbroken.runtime.checkpoint import CheckpointStore

            self.ckpt = CheckpointStore(ckpt_dir, log=lambda msg: self.journal(
                {"event": Event.CHECKPOINT_WARNING, "message": msg, "t": time.time()}))
        self._snap = None  # the state-copy buffer, made at the first copy (see the docstring)

    # ------------------------------------------------------------------ helpers
    @property
    def snap(self):
        """The buffer a state copy goes through (sender: captured when sent; joiner: received,
        verified, installed), allocated once at the first copy."""
        if self._snap is None:
            from unbroken.runtime.snapshot import Snapshot

            self._snap = Snapshot(self.trainer.state_tensors())
        return self._snap

    @property
    def my_slot(self) -> int:
        return self.slot_of[self.uid]

    def live_slots(self, members: list[int] | None = None) -> list[int]:
        return sorted(self.slot_of[u] for u in (members or self.comm.members))

    def _meta(self) -> dict:
        return {"step": self.step, "slot_of": {str(u): s for u, s in self.slot_of.items()},
                "admitted": self.admitted, "code": self.code_applied}

    def _buflen(self) -> int:
        return self.trainer.numel + self.cfg.groups + self._ndigest() + _TAIL

    def _ndigest(self) -> int:
        return self.cfg.groups ** 2 if self.cfg.sdc_every > 0 else 0

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
            self.compute_s, self.compute_n = 0.0, 0
            self.step_error = None
        t0 = time.perf_counter()
        contrib = list(self.contrib.get(self.my_slot, ()))
        mine = list(contrib)
        if self._check_step():  # the redundant check: the other hosted types, digests only
            mine += [t for t in self._hosted() if t not in mine]
        for t in mine:
            if t not in self.grads and self.step_error is None:
                out = None
                if contrib == [t]:  # the group's only contribution: compute it where the
                    # all-reduce will sum it (plain data parallelism's zero-copy step)
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
        self.compute_s += time.perf_counter() - t0

    def _step_failed(self, exc: BaseException) -> None:
        import traceback

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
            rest[_ERR] = 1.0  # contributes nothing; every member sees the error at the commit
        for i, t in enumerate(mine_copy):
            if i == 0:
                g.copy_(self.grads[t])
            else:
                g.add_(self.grads[t])
        for t in mine:
            rest[t] += 1.0
            rest[_LOSS] += tr.last_loss.get(t, float("nan"))
        if not mine:
            g.zero_()
        if self._check_step() and self.step_error is None:
            for t in self._hosted():
                if t in self.grads:
                    rest[n + t * n + self.my_slot] = float(digest52(self.grads[t]))
        if self.comm.rank == 0 and not self.comm.store_lost:
            try:  # one observer, so every member sees the same counts
                rest[_JOIN], rest[_CODE], rest[_STOP] = self._control()
            except Exception:
                self.comm.store_lost = True
        # any member that lost the coordinator makes every member stop after this commit
        lost = self.comm.store_lost or getattr(self.comm, "supervisor_lost", False)
        rest[_LOST] = 1.0 if lost else 0.0
        rest[_COUNT] = 1.0
        rest[_STEP] = float(self.step)
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
            if ok:
                found = self._step_check(buf)
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
        count = rest[_COUNT]
        if rest[_STEP] != k * count:
            raise DivergenceError(
                f"step {k}: members are at different steps (step sum {rest[_STEP]}, "
                f"expected {k} x {count:g}): a step was committed by only some members")
        cover = rest[:n]
        if any(c != 1.0 for c in cover):
            raise DivergenceError(
                f"step {k}: shard-type coverage {cover} is not all ones: a type is "
                f"missing from or counted twice in the sum")
        tr.apply(buf[:tr.numel])
        self.last_buf = buf
        self.join_seen = max(self.join_seen, int(rest[_JOIN]))
        self.incidents = 0
        self.step += 1
        self.journal({"event": Event.COMMIT, "step": k, "gen": self.comm.generation,
                      "members": self.comm.members,
                      "mine": list(self.contrib.get(self.my_slot, ())),
                      "plan": self._plan_record(),
                      "loss": rest[_LOSS] / n, "rolled": rolled,
                      "grad_norm": round(self._grad_norm(buf) / n, 9),
                      "compute_s": round(self.compute_s / max(1, self.compute_n), 6),
                      "t": time.time()})
        if self.ckpt is not None and self.step % self.ckpt_every == 0 \
                and self.comm.rank == 0 and self.step < self.cfg.steps:
            self.ckpt.save_async(self.step, tr.state_tensors(), self._meta())
        if int(rest[_CODE]) > self.code_applied:  # a hot update, at the same boundary for all
            self._apply_code(int(rest[_CODE]))
        if rest[_LOST] > 0:
            raise CoordinatorLostError(
                f"the coordinator's store or the supervisor is gone; stopped after step {k} "
                f"on every member")
        if rest[_STOP] > 0:
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

    # ------------------------------------------------------------------ incidents
    def _step_check(self, buf: torch.Tensor) -> tuple[str, dict] | None:
        """What every member reads from the same reduced buffer: a member's step error, a
        non-finite sum (NaN at the step it appears), or hosts of a type whose gradients differ
        bit for bit. None: commit."""
        tr, n = self.trainer, self.cfg.groups
        rest = self._check_region(buf)
        if rest[_ERR] > 0:
            return "code", {"errors": int(rest[_ERR]), "version": self.version}
        # the norm is NaN/inf iff an element is (or the squares overflow: then count exactly);
        # one reduction instead of an isfinite pass (a dot product: half a norm's time), and
        # _commit journals the same norm
        g = buf[:tr.numel]
        norm = float(torch.dot(g, g)) ** 0.5
        self._norm = (buf, norm)
        bad = 0 if np.isfinite(norm) else int((~torch.isfinite(buf[:tr.numel])).sum())
        if bad or not np.isfinite(rest[_LOSS]):
            return "implicit", {"nonfinite": bad}
        if self._check_step():
            d0 = tr.numel + n
            digests = _digests(buf[d0:d0 + n * n].view(n, n), range(n))
            bad = digest_mismatches(digests)
            if bad:
                return "sdc", {"mismatch": {str(t): {str(w): d for w, d in ds.items()}
                                            for t, ds in bad.items()}}
            self.journal({"event": Event.SDC_CHECK, "step": self.step, "ok": True,
                          "types": sum(1 for ds in digests.values() if len(ds) > 1),
                          "t": time.time()})
        return None

    def _incident(self, kind: str, detail: dict) -> bool:
        """Journal the incident; with verdicts, carry out the guard's decisions until one lets
        the step go on. True: commit this buffer (log-only); False: recompute the step."""
        n = self.incidents
        self.incidents += 1
        self.journal({"event": Event.INCIDENT, "kind": kind, "step": self.step, "n": n,
                      "gen": self.comm.generation, "members": self.comm.members,
                      "slot": self.my_slot, **detail, "t": time.time()})
        if self.verdicts and self.comm.rank == 0:  # one key to wait on (the journal says more)
            self.comm.store.set(incident_key(self.step, n), json.dumps({"kind": kind, **detail}))
        if not self.verdicts:
            if kind == "code":
                raise RuntimeError(f"step {self.step}: the training code failed on a member "
                                   f"({self.step_error or 'see its journal'})")
            return True  # log-only: the step goes on as it would without a guard
        while True:
            v = self._await_verdict(n)
            if int(v.get("code", 0)) > self.code_applied:
                self._apply_code(int(v["code"]))
            action = v.get("action")
            self.journal({"event": Event.VERDICT, "step": self.step, "n": n, **v,
                          "t": time.time()})
            if action == "retry":
                self.grads_step = -1
                return False
            if action == "restore":
                self._restore_to(int(v["step"]))
                return False
            if action == "commit":
                return True
            if action == "replay":
                # no types named (a NaN with no culprit): every shard type
                self._replay([int(t) for t in v["types"]] or list(range(self.cfg.groups)), n)
                n = self.incidents
                self.incidents += 1
                continue
            raise GuardStopError(f"step {self.step}: the guard stopped the job: "
                                 f"{v.get('reason', action)}")

    def _await_verdict(self, n: int) -> dict:
        key = verdict_key(self.step, n)
        try:
            self.comm.store.wait([key], timedelta(seconds=self.verdict_wait))
        except Exception as exc:
            raise GuardStopError(f"step {self.step}: no verdict for incident {n} within "
                                 f"{self.verdict_wait:.0f}s ({exc})") from None
        return json.loads(self.comm.store.get(key))

    def _replay(self, types: list[int], n: int) -> None:
        """Dual-phase replay reduced to what SPARe's redundancy allows: every member computes
        the suspect types on the same parameters and data; the digests go through one
        all-reduce, so the guard sees each machine's answer and takes the majority."""
        g = self.cfg.groups
        buf = torch.zeros(len(types) * g, dtype=torch.float64, device=self.dev)
        for i, t in enumerate(types):
            buf[i * g + self.my_slot] = float(digest52(self.trainer.grad(self.step, t)))
        ok = self.comm.allreduce(buf)
        found = {str(t): {str(w): d for w, d in ds.items()}
                 for t, ds in _digests(buf.view(len(types), g), types).items()}
        rec = {"ok": bool(ok), "digests": found,
               "uids": {str(self.slot_of[u]): u for u in self.comm.members}}
        if self.comm.rank == 0:
            self.comm.store.set(replay_key(self.step, n), json.dumps(rec))
        self.journal({"event": Event.REPLAY, "step": self.step, "n": n,
                      "members": self.comm.members, **rec, "t": time.time()})

    def _restore_to(self, step: int) -> None:
        """Roll back in place to the durable checkpoint of ``step`` (verified by the SDC check
        of the step before it); every member loads the same one."""
        if self.ckpt is None:
            raise GuardStopError(f"restore to step {step}: no checkpoint directory")
        if self.comm.rank == 0:
            self.ckpt.wait()
        path = self.ckpt.directory / f"step-{step:08d}"
        if step == 0:  # nothing verified yet: the seeded initial state is the clean one
            self._install(make_trainer(self.cfg).state_tensors(), {"step": 0}, path="initial",
                          reason="verdict")
            return
        deadline = time.monotonic() + self.verdict_wait
        while not path.is_dir():  # rank 0's background save may still be renaming it
            if time.monotonic() > deadline:
                raise GuardStopError(f"restore to step {step}: {path} never appeared")
            time.sleep(0.01)
        self._install(*self.ckpt.load(self.trainer.state_tensors(), path), path=str(path),
                      reason="verdict")

    def _apply_code(self, upto: int) -> None:
        """Hot update (or rollback) to the newest code record ``code/<upto>``: build the
        trainer of that version and carry the training state over; no process restarts."""
        rec = json.loads(self.comm.store.get(code_key(upto)))
        self.code_applied = upto
        if rec["version"] == self.version:
            return
        from dataclasses import replace as _replace

        new = make_trainer(_replace(self.cfg, model=rec["model"]))
        _copy_state(new.state_tensors(), self.trainer.state_tensors())
        old, self.trainer, self.version = (self.version, self.hooks.wrap_trainer(self, new),
                                           rec["version"])
        self.grads_step = -1
        self.journal({"event": Event.CODE, "step": self.step, "from": old, "to": self.version,
                      "model": rec["model"], "n": upto, "t": time.time()})

    def save_checkpoint_now(self) -> str | None:
        """Durable checkpoint of the committed state, written by the generation's rank 0 only
        (the state is a replica on every member). Blocks until it is on disk."""
        if self.ckpt is None or self.comm.rank != 0:
            return None
        fut = self.ckpt.save_async(self.step, self.trainer.state_tensors(), self._meta())
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
        self._install(*self.ckpt.load(self.trainer.state_tensors(), found[1]), path=found[1])
        return self.step

    def _install(self, tensors: list[torch.Tensor], meta: dict, path: str,
                 reason: str | None = None) -> None:
        """Make a loaded checkpoint the committed state (and its code version the running
        one), then journal the roll-back: commits of steps >= its step no longer count."""
        _copy_state(self.trainer.state_tensors(), tensors)
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

    # ------------------------------------------------------------------ recovery
    def _recover(self, members: list[int] | None = None, *, planned: bool = False,
                 restart: bool = False) -> None:
        """Enter a new generation and settle in it; loops on new failures.

        ``members``: a generation this member already entered (an admission's planned
        re-form, a joiner's ``join``); None: re-form after a failed op."""
        while True:
            if members is None:
                members = self.comm.reform()
            if self._settle(members, planned=planned, restart=restart):
                return
            members, planned = None, False

    def _settle(self, members: list[int], *, planned: bool, restart: bool = False) -> bool:
        """The first collective of every generation, whatever brought each member into it (a
        failed op, an admission at a step boundary, a joiner's first generation).

        One all-reduce of (step, old member, admitted records, joiner slot, planned, plan
        generation) per member gives everyone the same picture, so all take the same path:
        a member one commit behind is rolled forward with a peer's reduced buffer; joiners
        named in the buffer get the state; then either a fresh plan for the live slots (an
        admission, or members whose plans disagree because a settle broke half-way) or the
        failure re-plan ``rectlr.decide`` with what each group computed. Without this, a
        member recovering from a failed op and its peers admitting a spare at the same
        boundary entered different first collectives on the same group (a gloo mismatch).

        False: the generation broke during the settle (re-form and settle again)."""
        t0 = time.time()
        m, r = len(members), self.comm.rank
        old = not self.needs_state
        v = torch.zeros(6 * m, dtype=torch.float64, device=self.dev)
        v[r::m] = torch.tensor([
            float(self.step) if old else -1.0, 1.0 if old else 0.0, float(self.admitted),
            -1.0 if old else float(self.my_slot), 1.0 if planned else 0.0,
            float(self.plan_gen) if old else -1.0], dtype=torch.float64)
        if not self.comm.allreduce(v):
            return False
        cols = v.view(6, m).tolist()
        s = settle([Report(step=int(cols[0][i]), old=cols[1][i] == 1.0,
                           admitted=int(cols[2][i]), joiner_slot=int(cols[3][i]),
                           planned=cols[4][i] > 0, plan_gen=int(cols[5][i]))
                    for i in range(m)])
        if s.problem == "no state":
            raise WipeOutError(f"gen {self.comm.generation}: {s.reason} (members {members})")
        if s.problem is not None:
            raise DivergenceError(s.reason)
        if s.source is not None:
            b = (self.last_buf.clone() if r == s.source
                 else torch.zeros(self._buflen(), dtype=torch.float64, device=self.dev))
            if not self.comm.allreduce(b):
                return False
            if old and self.step == s.lo:
                self.journal({"event": Event.ROLL_FORWARD, "step": s.lo,
                              "from": members[s.source], "t": time.time()})
                self._commit(b, rolled=True)
        joiners = {members[i]: slot for i, slot in s.joiners.items()}
        for u, slot in joiners.items():
            self.slot_of[u] = slot
        if old:
            self.admitted = s.admitted
        fresh = s.fresh
        if joiners and not self._send_state(members, list(joiners)):
            return False
        live = self.live_slots(members)  # a joiner knows the old members' slots from here
        if fresh:
            d = self._fresh_plan(live)
        else:
            self._ensure_grads()
            d = decide(self.layout, live, self.stacks, self.depth,
                       computed={w: sorted(self.computed.get(w, ())) for w in live})
        if isinstance(d, WipeOut):
            self._wipeout(d, members)
            return True
        self.stacks, self.depth, self.contrib = d.stacks, d.depth, d.contributions()
        self.plan_gen = self.comm.generation
        if fresh:  # a step boundary for the plan: every group computes what it contributes
            self.computed = {w: set(ts) for w, ts in self.contrib.items()}
            if joiners:
                self.journal({"event": Event.RESTART if restart else Event.ADMIT, "step": self.step,
                              "gen": self.comm.generation, "members": members,
                              "joined": {str(u): s for u, s in joiners.items()},
                              "source": "memory" if restart else "snapshot", "reform_at": t0, "t": time.time()})
                return True
        for w, ts in d.patch.items():
            self.computed.setdefault(w, set()).update(ts)
        mine = [] if fresh else d.patch.get(self.my_slot, ())
        if mine:
            self.hooks.before_patch(self)
        for t in mine:
            self.grads[t] = self.trainer.grad(self.step, t)
        if not fresh:
            missing = set(self.contrib.get(self.my_slot, ())) - set(self.grads)
            assert not missing, f"plan assigns types {missing} that were never computed"
        self.journal({"event": Event.REPLAN, "step": self.step, "gen": self.comm.generation,
                      "members": members, "phase": d.phase, "depth": d.depth,
                      "patch": {str(self._uid_of(w)): list(ts) for w, ts in d.patch.items()},
                      "reason": d.reason, "fresh": fresh, "reform_at": t0, "t": time.time()})
        if not fresh:
            self.hooks.after_replan(self, d)
        return True

    # ------------------------------------------------------------------ wipe-out restart
    def _wipeout(self, d: WipeOut, members: list[int]) -> None:
        """No plan can cover every type: wait for replacements of the dead slots, admit them
        (a copy of the committed state every survivor holds) and resume this step."""
        k, st = self.step, self.comm.store
        live = set(self.live_slots(members))
        dead = set(range(self.cfg.groups)) - live
        self.journal({"event": Event.WIPEOUT, "step": k, "members": members,
                      "lost_types": list(d.lost_types), "dead_slots": sorted(dead),
                      "reason": d.reason, "t": time.time()})
        st.set(wipeout_key(self.uid), json.dumps({"step": k, "dead_slots": sorted(dead)}))
        # the first join records (in order) that cover every dead slot: the same for everyone
        from unbroken.core.membership import wipeout_cover

        deadline = time.monotonic() + self.wipeout_wait
        records: list[tuple[int, bool]] = []
        while (took := wipeout_cover(records, dead)) is None:
            j = self.admitted + len(records)
            if st.add(JOIN_COUNT, 0) > j:
                rec = json.loads(st.get(join_key(j + 1)))
                records.append((int(rec["slot"]), st.check([dead_key(rec["uid"])])))
                continue
            if time.monotonic() > deadline:
                covered = {slot for slot, gone in records if not gone}
                raise WipeOutError(f"step {k}: {d.reason}; no replacement for slots "
                                   f"{sorted(dead - covered)} within {self.wipeout_wait:.0f}s")
            try:
                st.wait([join_key(j + 1)], timedelta(seconds=0.5))
            except Exception:
                pass
        self._admit(self.admitted + took, restart=True)

    # ------------------------------------------------------------------ admission (spares)
    def _admit(self, upto: int, restart: bool = False) -> None:
        """Admit join records ``admitted+1..upto`` at a step boundary: a planned re-form with
        the joiners (the old generation is not aborted), then the settle copies the committed
        state to them from a member's snapshot (checksummed; a bad copy is refused and the
        next member's used) and gives everyone a fresh plan."""
        st = self.comm.store
        live = set(self.live_slots())
        new: list[dict] = []
        for i in range(self.admitted + 1, upto + 1):
            rec = json.loads(st.get(join_key(i)))
            if st.check([dead_key(rec["uid"])]):
                continue  # a spare that died before it was admitted
            if rec["slot"] not in live and rec["slot"] not in {r["slot"] for r in new}:
                new.append(rec)
        self.admitted = upto
        if not new:
            return
        gen = self.comm.generation + 1
        joiners = [r["uid"] for r in new]
        for r in new:
            st.set(admit_key(r["uid"]), json.dumps({"gen": gen, "joiners": joiners}))
        members = self.comm.reform(expect=joiners, planned=True)
        self._recover(members, planned=True, restart=restart)

    def _send_state(self, members: list[int], joiners: list[int]) -> bool:
        """Broadcast the snapshot (an all-reduce where only the source contributes) from each
        old member in turn until every joiner verified it. False: the generation broke."""
        from unbroken.runtime.snapshot import SnapshotError

        gen = self.comm.generation
        olds = [u for u in members if u not in joiners]
        for src in olds:
            if self.uid == src:
                self.snap.capture(self.trainer.state_tensors(), self._meta())
                info = {"meta": self.snap.meta, "digest": self.snap.digest()}
                self.comm.store.set(state_key(gen, src), json.dumps(info))
                payload = self.hooks.state_payload(
                    self, self.snap.payload().to(self.dev, copy=True))
            else:
                payload = torch.zeros_like(self.snap.payload(), device=self.dev)
            if not self.comm.allreduce(payload):
                return False
            good = 1.0
            if self.uid in joiners:
                info = json.loads(self.comm.store.get(state_key(gen, src)))
                try:
                    self.snap.receive(payload.cpu(), info["meta"], info["digest"])
                except SnapshotError as exc:
                    good = 0.0
                    self.journal({"event": Event.BAD_SNAPSHOT, "from": src, "error": str(exc),
                                  "t": time.time()})
            ack = torch.zeros(len(members), dtype=torch.float64, device=self.dev)
            ack[self.comm.rank] = good
            if not self.comm.allreduce(ack):
                return False
            if bool((ack == 1.0).all()):
                if self.uid in joiners:
                    meta = self.snap.restore_into(self.trainer.state_tensors())
                    self.needs_state = False
                    self.step = int(meta["step"])
                    self.admitted = int(meta["admitted"])
                    if int(meta.get("code", 0)) > self.code_applied:  # the running version
                        self._apply_code(int(meta["code"]))
                    self.slot_of = {int(u): int(s) for u, s in meta["slot_of"].items()}
                return True
        raise DivergenceError("every member's snapshot failed its checksum at the joiner")

    def join_and_run(self, slot: int, timeout: float = 120.0) -> torch.Tensor:
        """Spare: ask to take over ``slot``, wait to be admitted, receive the state, train."""
        st = self.comm.store
        n = st.add(JOIN_COUNT, 1)
        st.set(join_key(n), json.dumps({"uid": self.uid, "slot": slot}))
        st.wait([admit_key(self.uid)], timedelta(seconds=timeout))
        admit = json.loads(st.get(admit_key(self.uid)))
        members = self.comm.join(int(admit["gen"]))
        self.slot_of[self.uid] = slot
        self.needs_state = True
        self._recover(members)  # the settle names this joiner and copies the state to it
        self.journal({"event": Event.JOINED, "step": self.step, "gen": self.comm.generation,
                      "slot": slot, "t": time.time()})
        return self.run()


def _copy_state(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """Copy a training state (``state_tensors()`` order) into another trainer's tensors."""
    with torch.no_grad():
        for d, s in zip(dst, src):
            d.copy_(s)


def _digests(cells: torch.Tensor, types) -> dict[int, dict[int, int]]:
    """``{type: {slot: digest}}`` from summed digest cells (row i = ``types[i]``, column =
    slot; 0 = that slot did not compute the type)."""
    return {int(t): {w: int(cells[i, w]) for w in range(cells.shape[1])
                     if float(cells[i, w]) > 0}
            for i, t in enumerate(types)}

