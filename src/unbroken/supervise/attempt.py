"""One attempt of a job: the loop that tails the journals, feeds the guard and carries out its
orders, over the attempt's cluster (:mod:`~unbroken.supervise.launch`).

The supervisor (:mod:`unbroken.supervise.supervisor`) runs attempts until one finishes: a
restart the ladder orders ends an attempt (:class:`~unbroken.supervise.outcome.Restart`) and
the next one resumes from the durable checkpoint. Everything an attempt owns (processes,
journal tails, the pool of spares, the stack-dump thread) ends with it.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from unbroken.core.actions import (
    Evict,
    PostCode,
    PostVerdict,
    Quarantine,
    Replace,
    Respawn,
    RestartJob,
    StopJob,
)
from unbroken.core.anomaly import stall_suspected
from unbroken.core.faults import Fault, holder_faults
from unbroken.core.membership import left_behind
from unbroken.core.placement import make_layout, uncovered, wiped_out
from unbroken.core.ranks import lost_status
from unbroken.core.standby import refill
from unbroken.events import Event
from unbroken.procwait import ExitWaiter
from unbroken.protocol import (CODE_COUNT, STOP_KEY, ExitCode, code_key, done_key,
                               error_key)
from unbroken.supervise.drill import LauncherDrill
from unbroken.supervise.outcome import Ended, Restart, RunError
from unbroken.supervise.rankgroup import fence_reason
from unbroken.supervise.spec import JobSpec
from unbroken.supervise.tail import JournalTail

__all__ = ["Attempt"]

#: the most a hung member's stack dump may take before it is killed regardless
HUNG_DUMP_S = 3.0


def _fired(ev: dict) -> Fault:
    """The schedule's fault a ``fault`` event reports (``at``: the step it was scheduled for,
    when a slot's late holder fired it after)."""
    return Fault(ev["kind"], ev["group"], ev.get("at", ev["step"]))


class Attempt:
    """One attempt of the job: tails every group's journal, feeds the guard, carries out the
    guard's orders and the launcher's own duties (death notices, spares), until every member
    finished. Raises :class:`Restart` when a wipe-out cannot get replacements, :class:`Ended`
    when the members stopped on purpose."""

    #: the loop's period when no process exits: journal lines and the guard's clock (a death
    #: wakes it at once). The guard works in seconds; 50 ms is far inside its budget.
    TICK_S = 0.05

    def __init__(self, spec: JobSpec, emit: Callable[[dict], None],
                 signalled: Callable[[], int | None], c, fired: set, guard,
                 pending: list[Fault], xid_log: str | None, holders: dict[int, int],
                 restarting: bool, skip_old: bool, adopted=None) -> None:
        """``emit``: the supervisor's journal; ``signalled()``: the signal the supervisor
        received (SIGINT/SIGTERM), None while none came; ``adopted``: a standby's
        ``core.coordination.Adoption`` (members running since before this supervisor)."""
        self.c, self.spec, self.emit, self.signalled = c, spec, emit, signalled
        self.fired, self.guard, self.holders = fired, guard, holders
        self.pending = pending
        self.victims: set[int] = set()  # uids a scheduled fault hit (not real failures)
        self.restarting, self.skip_old = restarting, skip_old
        self.t_decided = time.time()
        self.tails: dict[int, JournalTail] = {}
        self.members = set(range(self.spec.groups))   # uids that hold a slot
        self.joined = set(self.members)               # ... and have trained in it
        self.slot_of = {u: u for u in self.members}
        self.pool = list(c.spares)                    # warm spares not yet assigned
        self.next_uid = max([self.spec.groups - 1, *c.uids, *c.spares]) + 1
        self.finished: dict[int, dict] = {}
        self.stopped: dict[int, int] = {}             # uid -> its on-purpose exit code
        self.handled: set[int] = set()
        self.restarts: set[int] = set()  # generations whose restart was announced
        self.restored = False
        self.seen: dict[int, int] = {}   # uid -> the first generation it was a member of
        self.wiped: dict[int, float] = {}  # step -> first wipe-out event time
        self.top, self.last_step_t = -1, time.time()
        self.checkpoint: str | None = None
        self.stop_posted: float | None = None
        self.drill = LauncherDrill(pending, c.cfg.model, xid_log, self.emit, fired, guard,
                                   kill_node=self._kill_node)
        if adopted is not None:  # where the members stopped: tails from there on
            self.members, self.joined = set(adopted.members), set(adopted.members)
            self.slot_of = dict(adopted.slot_of)
            self.top = adopted.step - 1
            for u in adopted.members:
                self._tail(u)
        for u in self.members | set(self.pool):  # XID lines name the pid of any holder
            for pid in getattr(c.procs[u], "pids", [c.procs[u].pid]):
                holders[pid] = u
        self.layout = make_layout(self.spec.groups, self.spec.ft.redundancy)
        self.holder = {s: s for s in range(self.spec.groups)}  # slot -> its newest holder
        if adopted is not None:
            self.holder.update({s: u for u, s in adopted.slot_of.items()})
        self.stop_code: tuple[int, str] | None = None  # a StopJob carried out
        guard.maskable = self._maskable
        guard.standby = lambda: len(self._warm())  # the ladder counts on the pool as it is
        self.stall_job, self.stall_pool = None, None  # stack dumps off the loop (_stall)
        self.dumpers: list[threading.Thread] = []  # hung members' dumps, then their kill
        self.exits = ExitWaiter()
        self._pool_said: list[int] | None = None
        self._note_pool()

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[int, dict]:
        from unbroken.runtime.ftcomm import declare_dead

        self.declare_dead = declare_dead
        try:
            return self._loop()
        finally:
            for ev in getattr(self.c, "drain_events", list)():  # a node lost as it ended (a
                self.emit(ev)  # wipe-out beside it): journaled, not dropped with the attempt
            self.exits.close()
            for tail in self.tails.values():
                tail.close()
            if self.stall_pool is not None:  # a dump in flight ends with its processes
                self.stall_pool.shutdown(wait=False, cancel_futures=True)
            for t in self.dumpers:  # no process outlives its attempt
                t.join(timeout=HUNG_DUMP_S + 11)

    def drain(self) -> None:
        """Journal what the attempt's processes wrote after its loop last read them. A
        restart ends the loop while the survivors still train until the cluster is closed,
        and the next attempt's tails start at the files' ends: their commits were missing
        from the run's report (80 steps trained, 52 reported), and a scheduled fault they
        fired meanwhile was not marked fired, so the next attempt injected it again. Call
        once the cluster is closed (nothing writes any more)."""
        for u, tail in self.tails.items():
            for ev in tail.read():
                if ev.get("event") == Event.FAULT:
                    self.fired.add(_fired(ev))
                self.emit(ev, src=f"group-{u}")
            tail.close()

    def _loop(self) -> dict[int, dict]:
        deadline = time.monotonic() + self.spec.timeout
        while True:
            self._read_journals()
            if self.signalled() is not None and self.stop_posted is None:
                self._post_stop()
            for ev in getattr(self.c, "drain_events", list)():  # node agents: a node lost,
                self.emit(ev)  # a machine's sample, an XID of its kernel log
                if ev["event"] == Event.NODE_HEALTH:
                    self.guard.on_node_health(ev)
                elif ev["event"] == Event.NODE_XID:
                    self.guard.on_node_xid(ev, time.time())
            self.drill.fire(self.top, self._holder)
            self.guard.poll(time.time(), live=self.members - set(self.finished))
            self._stall()
            self._orders()
            done = self._exits()
            if done is not None:
                return done
            if time.monotonic() > deadline:
                raise RunError(f"no finish within {self.spec.timeout:.0f}s")
            # sleep in the kernel until a process exits (a death is handled at once) or the
            # tick passes (journal lines, the guard's clock): polling here cost a fifth of a
            # core that the training processes on the same cores lacked
            self.exits.wait(self.c.procs.values(), self.TICK_S)

    def _read_journals(self) -> None:
        """Every process's new journal lines, handled in order."""
        for u in list(self.c.uids):
            for ev in self._tail(u).read():
                self._on_event(u, ev)

    def _stall(self) -> None:
        """No step for a while but every heartbeat fresh: the stack dumps that localise it run
        on a thread (py-spy pauses each process in turn, seconds in all), so death notices and
        orders keep flowing meanwhile; the vote goes to the guard when it is in."""
        job = self.stall_job
        if job is not None and job.done():
            self.stall_job = None
            try:
                self.guard.on_stall(*job.result())
            except Exception as exc:
                self.guard.stall_failed(exc)
        elif job is None and self.spec.ft.guard == "act" and stall_suspected(
                time.time(), self.last_step_t, self.top >= 0):
            from concurrent.futures import ThreadPoolExecutor

            from unbroken.detect.stacks import locate_stall

            self.last_step_t = time.time()  # re-arm: one localisation per stall period
            # members that have trained in their slot: a spare sent to a slot but not yet
            # admitted waits in its join, an "outlier" in another replica that left every
            # 16-group stall vote of the soak inconclusive
            live = [u for u in self._live() if u in self.joined]
            if self.stall_pool is None:
                self.stall_pool = ThreadPoolExecutor(1, thread_name_prefix="stall")
            self.stall_job = self.stall_pool.submit(
                locate_stall, {u: self.c.procs[u].pid for u in live},
                {u: self.slot_of[u] for u in live}, fault_dir=Path(self.c.journal_dir),
                dump=getattr(self.c, "dump_stacks", None))  # node agents dump their own

    def _post_stop(self, why: str | None = None) -> None:
        """Ask every member to stop after the next committed step (rank 0 reads the key)."""
        self.stop_posted = time.time()
        self.emit({"event": Event.STOP_REQUESTED,
                   "signal": why or signal.Signals(self.signalled()).name})
        self.c.store.add(STOP_KEY, 1)
        for u in list(self.pool):  # a waiting spare holds nothing: it just goes
            self.c.procs[u].kill()

    def _holder(self, slot: int) -> tuple[int, int] | None:
        held = [u for u in self._live() if self.slot_of[u] == slot]
        return (held[0], self.c.procs[held[0]].pid) if held else None

    def _tail(self, u: int) -> JournalTail:
        if u not in self.tails:
            tail = self.tails[u] = JournalTail(Path(self.c.journal_dir) / f"group-{u}.jsonl")
            if self.skip_old:  # skip what a previous incarnation or run wrote
                tail.pos = tail.path.stat().st_size if tail.path.exists() else 0
        return self.tails[u]

    def _live(self) -> list[int]:
        return sorted(u for u in self.members
                      if u not in self.finished and self.c.procs[u].poll() is None)

    # ------------------------------------------------------------------ journal events
    def _on_event(self, u: int, ev: dict) -> None:
        name, emit = ev.get("event"), self.emit
        if name == Event.FAULT:
            self.victims.add(ev.get("uid", ev["group"]))
            self.fired.add(_fired(ev))
        if name in (Event.STOPPED, Event.COORDINATOR_LOST) and ev.get("checkpoint"):
            self.checkpoint = ev["checkpoint"]
        if name == Event.RESTORE and self.restarting and not self.restored \
                and ev.get("reason") != "verdict":
            self.restored = True
            emit({"event": Event.RESTART, "step": ev["step"], "source": ev["source"],
                  "reason": "wipe-out without replacements", "t": self.t_decided,
                  "t_ready": ev["t"]})
        if name == Event.RESTART:  # one per survivor; the driver's line counts it once
            if ev["gen"] not in self.restarts:
                self.restarts.add(ev["gen"])
                emit({"event": Event.RESTART, "step": ev["step"], "source": ev["source"],
                      "reason": "wipe-out", "t_ready": ev["t"],
                      "t": self.wiped.get(ev["step"], ev["reform_at"])})
            ev = {**ev, "event": Event.RESTARTED}
        emit(ev, src=f"group-{u}")
        now = time.time()
        if name == Event.COMMIT:
            self.guard.on_commit(ev, uid=u)
            if ev["step"] > self.top:
                self.top, self.last_step_t = ev["step"], now
        elif name == Event.INCIDENT:
            self.guard.on_incident(ev, now)
        elif name == Event.REPLAY:
            self.guard.on_replay(ev, now)
        elif name == Event.SDC_CHECK:
            self.guard.on_check(ev)
        elif name in (Event.CHECKPOINT, Event.RESTORE):
            self.guard.on_checkpoint(ev)
        elif name == Event.HEALTH:
            self.guard.on_health(ev, u)
        elif name == Event.JOINED:
            self.joined.add(u)
            emit({"event": Event.JOIN, "uid": u, "slot": ev["slot"], "step": ev["step"]})
        elif name == Event.WIPEOUT:
            self.wiped.setdefault(ev["step"], ev["t"])
        if "members" in ev and "gen" in ev:
            for m in ev["members"]:  # lines of several journals arrive out of order: the least
                self.seen[m] = min(self.seen.get(m, ev["gen"]), ev["gen"])
        if name in (Event.REPLAN, Event.WIPEOUT) and "members" in ev:
            # a holder the survivors re-formed without while its process lives: a hang
            holders = {u: self.seen[u] for u in self.members - self.handled if u in self.seen}
            for gone in left_behind(holders, ev.get("gen", math.inf), ev["members"]):
                if gone not in self.finished and self.c.procs[gone].poll() is None:
                    self._lost(gone, "heartbeat")

    # ------------------------------------------------------------------ losses and orders
    def _maskable(self, lost: tuple[int, ...]) -> bool:
        """Can the holders of the other slots cover every shard type without ``lost``?"""
        live = {self.slot_of[u] for u in self.members
                if u not in lost and u not in self.finished and self.c.procs[u].poll() is None}
        return not uncovered(self.layout, live)

    def _lost(self, uid: int, how: str) -> None:
        """A member died (exit) or hung (left behind): the ladder answers. When the slots
        without a holder leave a shard type uncovered (a wipe-out), the fault names every such
        slot's last holder, so one answer refills them all (``core.placement.wiped_out``)."""
        for ev in self._tail(uid).read():  # its own last lines first: an injected fault says so
            self._on_event(uid, ev)
        now = time.time()
        if uid not in self.victims:  # a real failure, not a fire drill:
            self.emit({"event": Event.FAULT, "kind": "death" if how == "exit" else "hang",
                       "group": self.slot_of[uid], "uid": uid, "step": self.top + 1,
                       "external": True, "t": now})  # accounted like an injected one
        if self.spec.ranks_per_group > 1:
            # which rank fenced the group and by which rule, if one did before the group was
            # found lost (rank 0's line came with its journal above; another rank's journal
            # is not tailed)
            fenced = fence_reason(self.c.journal_dir, uid)
            if fenced is not None:
                self.emit(fenced, src=f"group-{uid}")
        if self._maskable((uid,)) or self.stop_posted is not None:
            self.guard.on_member_lost(uid, how, now)
        else:
            gone, why = wiped_out(self.holder, {self.slot_of[u] for u in self.members
                                                 if u != uid}, uid)
            self._evict(uid, how)  # this one is out first; the answer refills every slot
            self.guard.on_wipeout(gone, now, why)
        self._orders()

    def _orders(self) -> None:
        """Carry out the guard's actions in order (``core.actions``: one mapping per rung)."""
        st = self.c.store
        while self.guard.orders:
            a = self.guard.orders.pop(0)
            if isinstance(a, PostCode):
                st.set(code_key(a.n), json.dumps(a.record))
                st.add(CODE_COUNT, 1)  # rank 0 reads it: every member swaps at one boundary
                self.emit({"event": Event.CODE_POSTED, "n": a.n, **a.record})
            elif isinstance(a, PostVerdict):
                st.set(a.key, json.dumps(a.verdict))
                self.emit({"event": Event.VERDICT_POSTED, "key": a.key, **a.verdict})
            elif isinstance(a, Evict):
                self._evict(a.uid, a.how)
            elif isinstance(a, Replace):
                self._replace(a.uid)
            elif isinstance(a, Respawn):
                self._replace(a.uid, fresh=True)
            elif isinstance(a, Quarantine):
                self.emit({"event": Event.QUARANTINE, "group": a.uid,
                           "slot": self.slot_of.get(a.uid)})
            elif isinstance(a, RestartJob):
                raise Restart(a.reason, a.backoff)
            elif isinstance(a, StopJob):
                self.stop_code = (a.code, a.reason)
                if self._live():
                    self._post_stop(f"ladder: {a.reason}")
                else:
                    raise Ended(ExitCode(a.code), a.reason)

    def _evict(self, uid: int, how: str) -> None:
        """Take ``uid`` out: SIGKILL if it still runs, a death notice, no longer a member.

        A member left behind while its process lives (``how`` = heartbeat) is dumped first:
        its stacks are the only record of why it went silent, and the survivors have already
        re-formed without it, so the dump delays nothing (the kill follows on a thread)."""
        if uid in self.handled or uid not in self.slot_of:
            return
        from unbroken.detect.stacks import pyspy_path

        stacks = None
        if self.c.procs[uid].poll() is None:
            if how == "heartbeat" and not hasattr(self.c, "dump_stacks") and pyspy_path():
                stacks = self._dump_then_kill(uid)
            else:
                _kill(self.c.procs[uid])
        self.declare_dead(self.c.store, uid)  # survivors drop it at once, no heartbeat wait
        self.handled.add(uid)
        self.members.discard(uid)
        self.emit({"event": Event.DETECTED, "group": uid, "slot": self.slot_of[uid], "how": how,
                   **({"stacks": stacks} if stacks else {})})

    def _dump_then_kill(self, uid: int) -> str:
        """py-spy (non-blocking: it reads a stopped or wedged process's memory) into
        ``stacks/hung-<uid>.txt`` beside the journals, then SIGKILL, on a thread; the path."""
        from unbroken.detect.stacks import dump_stacks

        proc = self.c.procs[uid]
        path = Path(self.c.journal_dir) / "stacks" / f"hung-{uid}.txt"

        def dump_and_kill() -> None:
            try:
                d = dump_stacks(proc.pid, timeout=HUNG_DUMP_S)
                path.parent.mkdir(exist_ok=True)
                path.write_text(f"uid {uid} pid {proc.pid} ({d.method}, {d.seconds:.2f} s)\n"
                                f"{d.text}")
            except OSError:
                pass  # the dump is a diagnosis: the kill below is what matters
            finally:
                _kill(proc)

        t = threading.Thread(target=dump_and_kill, name=f"hung-dump-{uid}", daemon=True)
        t.start()
        self.dumpers.append(t)
        return str(path)

    def _replace(self, uid: int, fresh: bool = False) -> None:
        """The slot of a dead ``uid`` goes to a warm spare, or (``fresh``: retry in place) to a
        new process started for it now."""
        slot = self.slot_of[uid]
        if self.stop_posted is not None or self.holder.get(slot) != uid:
            return  # stopping, or the slot already has a newer holder
        if fresh:
            self._spawn()
            spare = self.pool.pop()  # the one just started, not a warm one
        elif self._warm():
            spare = self.pool.pop(0)
        else:
            self.emit({"event": Event.NO_SPARE, "slot": slot})
            return
        self._note_pool()
        self.slot_of[spare] = slot
        self.holder[slot] = spare
        self.members.add(spare)
        # the slot's next scheduled faults (the old holder's unfired ones included: it is gone)
        drill = holder_faults([f for f in self.pending if f not in self.fired], slot)
        self.c.assign(spare, slot, [(f.kind, f.step) for f in drill])
        self.guard.on_assigned(spare, uid)
        self.emit({"event": Event.ASSIGN, "uid": spare, "slot": slot,
                   **({"fresh": True} if fresh else {})})
        for _ in range(refill(len(self.pool))):  # keep one warm for the next fault (its
            self._spawn()                        # start-up takes CPU from training here)

    def _warm(self) -> list[int]:
        """The pool without the spares that died waiting (their node went with them)."""
        self.pool = [u for u in self.pool if self.c.procs[u].poll() is None]
        self._note_pool()
        return self.pool

    def _note_pool(self) -> None:
        """The warm pool once per change (``spares``: recorded in etcd, an operator's view of
        what a takeover would find; the spares themselves go with their store)."""
        if self.pool != self._pool_said:
            self._pool_said = list(self.pool)
            self.emit({"event": Event.SPARES, "pool": list(self.pool), "pids": {
                str(u): list(getattr(self.c.procs[u], "pids", [self.c.procs[u].pid]))
                for u in self.pool}})

    def _kill_node(self, f: Fault) -> None:
        """A ``node:I@S`` drill: node I's agent is killed with every process it started
        (``NodeCluster.kill_node``); ``cut:I@S``: it is stopped, its workers run on
        (``NodeCluster.cut_node``). Each member there is a victim of the fault."""
        node_of = getattr(self.c, "node_of", {})
        now = time.time()
        for u in self._live():
            if node_of.get(u) == f.group:
                self.victims.add(u)
                self.emit({"event": Event.FAULT, "kind": f.kind, "group": self.slot_of[u],
                           "uid": u, "node": f.group, "step": f.step, "at": f.step, "t": now})
        self.fired.add(f)
        (self.c.kill_node if f.kind == "node" else self.c.cut_node)(f.group)

    def _spawn(self) -> None:
        self.c.spawn(self.next_uid, standby=True)
        p = self.c.procs[self.next_uid]
        for pid in getattr(p, "pids", [p.pid]):
            self.holders[pid] = self.next_uid
        self.pool.append(self.next_uid)
        self.next_uid += 1
        self._note_pool()

    # ------------------------------------------------------------------ process exits
    def _exits(self) -> dict[int, dict] | None:
        c = self.c
        for u in sorted(self.members):
            if u in self.finished or u in self.stopped:
                continue
            rc = c.procs[u].poll()
            # store round trips only when they can answer: ``done`` follows the last commit,
            # ``error`` comes just before the exit (every tick, for every member, they were
            # most of the supervisor's and the store's CPU)
            if (rc is not None or self.top >= self.spec.steps - 1) \
                    and c.store.check([done_key(u)]):
                self.finished[u] = json.loads(c.store.get(done_key(u)))
                continue
            if rc is None or u in self.handled:
                continue
            lost = lost_status(rc)
            if lost and self.stop_posted is None:
                # killed by a signal, a spare whose admission broke, or a group of ranks that
                # fenced itself (a silent rank); the error its other ranks may have posted
                # (a collective broken by the lost rank) is a consequence, not the cause
                self._lost(u, "exit")
            elif c.store.check([error_key(u)]):
                raise RunError(f"group {u} failed:\n{c.store.get(error_key(u)).decode()}")
            elif rc == ExitCode.WIPEOUT and self.stop_posted is None:
                # the survivors of a wipe-out waited for replacements in vain
                self._job_lost(f"group {u} got no replacement for a wipe-out in time (exit 4)")
            elif rc in (ExitCode.STOPPED, ExitCode.COORDINATOR_LOST, ExitCode.NO_PROGRESS):
                self.stopped[u] = rc
            elif self.stop_posted is not None:
                self.stopped[u] = rc  # stopping anyway: record, do not replace
            else:
                raise RunError(f"group {u} exited with code {rc}:\n{c.stderr(u)[-2000:]}")
        if self.stopped and self.members & self.joined <= set(self.finished) | set(self.stopped):
            # their last lines (the commits, the stop and its checkpoint) were written after
            # this tick read the journals, just before they exited: read them first, or the
            # ending names an older step and no checkpoint (seen under load)
            self._read_journals()
            raise self._ended()  # (a replacement never admitted is closed with the attempt)
        if self.finished and self.members & self.joined <= set(self.finished):
            # every member that trained finished; a replacement still starting up (sent in the
            # last steps) was never admitted and has nothing to do: it goes
            for u in self.members - set(self.finished):
                c.procs[u].kill()
            return {u: self.finished[u] for u in sorted(self.finished)}
        if not self.members:
            self._job_lost("every group is gone and no spare is left")
        if not self.members & self.joined and self.stop_posted is None:
            # the spares sent to the slots wait for an admission: the state they would copy
            # is gone with the last group that trained (every group killed at once; a CI run's
            # survivors all left out). They waited 120 s, and the run failed on their timeout
            self._job_lost("every group that trained is gone; the spares sent to their slots "
                           "have no state to join")
        return None

    def _job_lost(self, why: str) -> None:
        """The in-memory state is gone (no member left to restore from): the ladder answers
        with a restart from the checkpoint (retry in place, restart, requeue after a backoff)
        or gives up. Raises :class:`Restart` or :class:`Ended`; the attempt's processes are
        closed either way."""
        self.guard.on_wipeout((), time.time(), why)
        for a in self.guard.orders:
            if isinstance(a, StopJob):
                self.guard.orders.clear()
                raise Ended(ExitCode(a.code), f"the guard's ladder gave up: {a.reason}")
        self._orders()  # a RestartJob raises
        raise Restart(why)

    def _ended(self) -> Ended:
        """Why every member stopped: the most telling code among theirs."""
        codes = set(self.stopped.values())
        if self.stop_code is not None:  # the ladder gave up (a StopJob carried out)
            code, reason = self.stop_code
            where = f"; checkpoint {self.checkpoint}" if self.checkpoint else ""
            return Ended(ExitCode(code), f"the guard's ladder gave up: {reason}{where}",
                          self.checkpoint)
        where = f"; checkpoint {self.checkpoint}" if self.checkpoint else ""
        step = self.top + 1
        if ExitCode.NO_PROGRESS in codes:
            return Ended(ExitCode.NO_PROGRESS, f"the guard's ladder gave up at step {step} "
                                                f"(exit 6){where}", self.checkpoint)
        if ExitCode.COORDINATOR_LOST in codes:
            return Ended(ExitCode.COORDINATOR_LOST,
                          f"the members found the supervisor silent and stopped after step "
                          f"{self.top}{where}; --resume continues", self.checkpoint)
        sig = signal.Signals(self.signalled() or signal.SIGINT)
        code = ExitCode.INTERRUPTED if sig == signal.SIGINT else ExitCode.TERMINATED
        return Ended(code, f"stopped on {sig.name} after step {self.top}{where}; --resume "
                            f"continues", self.checkpoint)


def _kill(proc) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
