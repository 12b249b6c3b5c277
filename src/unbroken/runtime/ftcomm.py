"""Fault-tolerant all-reduce over gloo: abandon the broken op, re-form a numbered group.

Why this exists
---------------
On torch 2.13 with the gloo backend (CPU) a process group cannot be repaired in place:

* ``dist.shrink_group`` raises ``TypeError`` for gloo (``supports_shrinking == False``);
* ``ProcessGroupGloo.abort()`` does not unblock an op that is already in flight;
* when a peer is SIGKILLed, only the ranks that talk to it directly get a ``RuntimeError``
  (12-22 ms); the others keep waiting on survivors that already left the collective, until the
  PG timeout. When a peer hangs (SIGSTOP), *every* survivor waits for the full PG timeout.

(Measured on this machine: ``shared/reference/gloo-failures.md`` sections 2-3.)

So survivors do not try to fix the old group. They *abandon* it and build a new one:

1. Every collective is issued with ``async_op=True``; the caller sleeps until the op's future
   completes or the generation is aborted, so no thread ever blocks in gloo.
2. A heartbeat thread judges the peers and raises the generation's abort flag when one is dead
   or silent; a gloo error does the same, so all survivors stop within milliseconds. The flag
   reaches the other members through the store and a UDP doorbell, both off the step's
   critical path (:mod:`~unbroken.runtime.ftcomm_heartbeat`). The local flag itself is kept
   here, on the communicator: the heartbeat thread, the doorbell thread, the op and the
   re-form all read and write it.
3. On abort the in-flight op, its group and its buffer go to a *graveyard*, never waited on
   and never freed. 1 and 3 are the op path (:mod:`~unbroken.runtime.ftcomm_ops`).
4. ``reform()`` agrees in the store on the members of generation ``g+1`` (the live ones,
   plus admitted joiners) and builds its process group; ``join()`` is a joiner's side
   (:mod:`~unbroken.runtime.ftcomm_rendezvous`).

The store must be hosted by a long-lived process that is not a worker (a launcher /
coordinator), so any worker, PG rank 0 included, may die. The store itself is a single point of
failure, as torchft's lighthouse is.

Decisions (who is stale, who is live, when the rendezvous is complete) are pure functions in
:mod:`unbroken.core.membership`.

Known limits (by design of this building block)
-----------------------------------------------
* ``allreduce`` returning True means *this* rank received every contribution. A peer can still
  have failed in the same op (it died after sending). Step-level agreement on commit, and the
  state broadcast after a re-form, belong to the training loop.
* A second failure *during* ``reform``: a member that dies in it, even between counting
  itself in and writing its record, is not waited for; the *leader* dying mid-rendezvous is
  surfaced as :class:`RendezvousError` after ``rendezvous_timeout``, not masked.
* Scale-up is by admission only: a joining process (``joining=True``) runs no collective
  until the members name the generation it enters (``reform(expect=[uid])`` on their side,
  ``join(gen)`` on its side); the state copy is the training loop's business.
* Processes that used this class should leave with ``os._exit`` (in the entry point, not in the
  library): interpreter shutdown may otherwise wait on threads of abandoned groups.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from unbroken.events import Event
from unbroken.protocol import DEAD_EPOCH, ExitCode, dead_key, hb_key, plane_ns
from unbroken.core.membership import next_members
from unbroken.runtime.ftcomm_rendezvous import (  # noqa: F401  (LAZY_INIT_ENV: its home until now)
    LAZY_INIT_ENV,
    Rendezvous,
    RendezvousError,
    StoreLostError,
)
from unbroken.runtime.ftcomm_heartbeat import Heartbeat, abort_key
from unbroken.runtime.ftcomm_heartbeat import bell_key  # noqa: F401  (its home until now)
from unbroken.runtime.ftcomm_ops import OpPath, short_error

__all__ = ["FTComm", "RendezvousError", "StoreLostError", "declare_dead", "bell_key", "LAZY_INIT_ENV"]


def declare_dead(store: dist.Store, uid: int) -> None:
    """Coordinator hook: announce that worker ``uid`` is gone (e.g. its process exited).

    Survivors drop it at once instead of waiting ``staleness`` seconds for its heartbeat to go
    stale. Safe to call more than once.
    """
    store.add(dead_key(uid), 1)
    store.add(DEAD_EPOCH, 1)


class FTComm(OpPath):
    """A generation-numbered gloo communicator that survives dead and hung members.

    Parameters
    ----------
    uid:
        This worker's stable id (an int; unique across the job, unlike a PG rank).
    members:
        Initial member uids (all must construct an FTComm; generation 0 waits for all of them).
    store / host, port:
        A ``TCPStore`` client, or the address of the coordinator-hosted TCPStore.
    heartbeat_period, staleness:
        Heartbeat interval and how long a silent member is tolerated (seconds).
    pg_timeout:
        gloo timeout of each generation's process group; only a safety net here, since ops are
        abandoned on the abort flag long before it.
    rendezvous_timeout:
        Leader's deadline to wait for live members; followers wait a little longer.
    poll_interval:
        How often ``allreduce`` re-checks the op while waiting, as a safety net (the op's
        future and an abort wake it at once).
    """

    def __init__(
        self,
        uid: int,
        members: list[int],
        *,
        store: dist.TCPStore | None = None,
        host: str | None = None,
        port: int | None = None,
        heartbeat_period: float = 0.1,
        staleness: float = 0.3,
        pg_timeout: float = 60.0,
        rendezvous_timeout: float = 30.0,
        store_timeout: float = 60.0,
        poll_interval: float = 0.1,
        joining: bool = False,
        backend: str = "gloo",
        supervisor_staleness: float = 0.0,
        init_timeout: float = 5.0,
        rank: int = 0,
        ranks: int = 1,
    ) -> None:
        members = next_members(int(m) for m in members)
        if joining:
            members = []
        elif uid not in members:
            raise ValueError(f"uid {uid} is not among the members {members}")
        if not 0 < heartbeat_period < staleness:
            raise ValueError("need 0 < heartbeat_period < staleness")
        if store is None:
            if host is None or port is None:
                raise ValueError("give either store= or host= and port=")
            store = dist.TCPStore(
                host, int(port), is_master=False, wait_for_workers=False,
                timeout=timedelta(seconds=store_timeout),
            )
        self.uid = int(uid)
        # rank ``rank`` of a group of ``ranks``: this communicator joins rank ``rank`` of the
        # other groups (its plane, keys in ``protocol.plane_ns(rank)``); the other ranks of the
        # own group are watched like peers, and one gone silent fences the group
        self.plane, self.ranks = int(rank), int(ranks)
        self.ns = plane_ns(self.plane)
        self.backend = backend
        self.store = store
        self.heartbeat_period = float(heartbeat_period)
        self.staleness = float(staleness)
        # Until this worker's first collective completes, every member is still starting up
        # (imports, model build): a starved start-up must not look like a hang, so silence is
        # judged against a longer limit. After that op completed, every member got past it.
        self.startup_staleness = max(self.staleness, 5.0)
        self._warm = False
        self.pg_timeout = float(pg_timeout)
        self.rendezvous_timeout = float(rendezvous_timeout)
        # a new generation's process group must connect within this (a member that hung or
        # died after the rendezvous then costs this long and a re-form, see ``reform``). Well
        # inside the rendezvous deadline: members whose connect went through (the lost one had
        # reached them) fail their first op at once and wait in the next rendezvous for the
        # ones still connecting. With a 10 s deadline the leader dropped seven and eight live
        # members of a 16-group soak that were still in gloo's connect to a peer an XID had
        # just killed; the deadline is what a member missing while its heartbeat beats (a
        # stall: the guard's stack vote evicts it sooner) costs a re-form
        self.init_timeout = min(float(init_timeout), self.rendezvous_timeout / 2)
        self.poll_interval = float(poll_interval)

        self._gen = 0
        self._members = members
        self._lock = threading.Lock()  # the generation and its abort flag, read together
        self._aborted_gen = -1  # highest generation known to be aborted
        self._abort_reason: str | None = None
        self.last_cause: str | None = None  # why the last re-form's old generation broke
        self._detected_at: float | None = None  # wall time this worker noticed the abort
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self.graveyard: list[tuple[Any, Any, Any]] = []
        self.journal: list[dict[str, Any]] = []
        self.on_issue: Any = None  # test hook: called once right after the next op is issued
        # the worker's journal: why this rank fences its group, written before it exits
        self.on_fence: Any = None
        self.on_rendezvous: Any = None  # test hook: called once between a re-form's member
        #                                 list and its process group
        # the store (hosted by the coordinator) stopped answering: no re-form is possible any
        # more; ops already running finish on gloo alone, the training loop must stop cleanly
        self.store_lost = False
        # the supervisor's own heartbeat has not moved for ``supervisor_staleness`` s (0: not
        # watched): the training loop stops as if it were gone (``ftcomm_heartbeat``)
        self.supervisor_staleness = float(supervisor_staleness)
        self.supervisor_lost = False

        self._attach(store)
        if joining:
            self._gen = -1  # no generation until admitted
            return
        t0 = time.monotonic()
        self._rdzv.init_pg(0, members)
        self.journal.append({"event": Event.INIT, "gen": 0, "members": list(members),
                             "pg_init_s": round(time.monotonic() - t0, 4), "t": time.time()})

    def _attach(self, store: Any, hb_client: Any = None) -> None:
        """The store's users: the rendezvous of each next generation (on the caller's client)
        and the heartbeat thread with its doorbell (a client and a UDP socket of their own)."""
        self.store = store
        self._rdzv = Rendezvous(
            self.uid, store, backend=self.backend, heartbeat_period=self.heartbeat_period,
            staleness=self.staleness, rendezvous_timeout=self.rendezvous_timeout,
            init_timeout=self.init_timeout, pg_timeout=self.pg_timeout, live=self.live_now,
            judging_staleness=self._staleness, graveyard=self.graveyard, stop=self._stop,
            ns=self.ns)
        self._hb = Heartbeat(self, self.uid, store, period=self.heartbeat_period,
                             staleness=self.staleness,
                             supervisor_staleness=self.supervisor_staleness, stop=self._stop,
                             ns=self.ns, siblings={j: hb_key(self.uid, plane_ns(j))
                                                   for j in range(self.ranks) if j != self.plane},
                             client=hb_client)
        # its containers, updated in place: ``watched`` is read at every step boundary
        self.watched = self._hb.watched
        self.beats, self.late_beats = self._hb.beats, self._hb.late_beats

    def reattach(self, store: Any, hb_client: Any = None) -> None:
        """Move onto a new coordinator's store (``runtime.reattach``), keeping the generation,
        its members and its process group: gloo's pairs are sockets between the members, the
        store only brokered them. The old heartbeat stops; the new one judges the peers
        against the start-up limit until the next op completes, since they re-attach one by
        one. Call at a step boundary, with no op in flight. ``hb_client``: the heartbeat's
        own client of ``store``, if one was connected ahead."""
        self._stop.set()
        self._hb.close(wait=False)  # its thread may sit in a call on the dead store
        self._stop = threading.Event()
        self._wake.clear()
        self.store_lost = self.supervisor_lost = False
        self._warm = False
        old = self._rdzv
        self._attach(store, hb_client)
        self._rdzv.pg, self._rdzv.reports = old.pg, old.reports  # the generation goes on
        self.journal.append({"event": Event.REATTACHED, "gen": self._gen,
                             "members": list(self._members), "t": time.time()})

    # ------------------------------------------------------------------ public state
    @property
    def generation(self) -> int:
        return self._gen

    @property
    def members(self) -> list[int]:
        return list(self._members)

    @property
    def rank(self) -> int:
        return self._members.index(self.uid)

    # ------------------------------------------------------------------ abort flag
    # the local flag: raised by the heartbeat thread, the doorbell thread, the op and the
    # re-form, read by the op on every wake-up
    @property
    def aborted(self) -> bool:
        """True when the current generation is known to be broken (call ``reform``)."""
        return self._aborted_gen >= self._gen

    def _check_abort(self, gen: int) -> bool:
        """The local flag: set by a gloo error here, by the heartbeat thread (a dead or stale
        peer) or by the heartbeat thread finding the store's flag (a peer broke the generation)."""
        return self._aborted_gen >= gen

    def fail(self, reason: str) -> None:
        """Declare the current generation broken from the caller's side (every member will
        abandon its op and ``reform``)."""
        self._set_abort(self._gen, reason)
        self._note_detect(reason)

    def _set_abort(self, gen: int, reason: str, store: Any = None) -> None:
        """Mark ``gen`` aborted locally and in the store (``store``: the caller thread's client)."""
        with self._lock:
            if self._abort_reason is None and gen == self._gen:
                self._abort_reason = reason
            first = self._aborted_gen < gen
            self._aborted_gen = max(self._aborted_gen, gen)
        if first:
            st = store or self.store
            with self._lock:
                ring = [m for m in self._members if m != self.uid] if gen == self._gen else []
            try:  # a counter: every member's heartbeat reads it with the peers' counters
                st.add(abort_key(gen, self.ns), 1)
            except Exception:  # no coordinator: peers will see the gloo error themselves
                self.store_lost = True
            self._hb.ring(gen, ring)  # and every member's doorbell rings now, not at its next beat
        self._wake.set()

    def _peer_aborted(self, gen: int, how: str = "") -> None:
        """A peer broke ``gen`` (its flag, or its doorbell): wake our op, publish nothing."""
        with self._lock:
            if self._gen == gen and self._aborted_gen < gen:
                self._aborted_gen = gen
                if self._abort_reason is None:
                    self._abort_reason = "abort flag set by a peer" + how
        self._wake.set()

    def _note_detect(self, reason: str) -> None:
        if self._detected_at is None:
            self._detected_at = time.time()
            self.journal.append({"event": Event.ABORT, "gen": self._gen, "reason": reason,
                                 "t": self._detected_at})

    # ------------------------------------------------------------------ re-form
    def offer(self, report: Any) -> None:
        """A JSON value this member publishes with the next :meth:`reform` or :meth:`join`;
        once the generation is formed, :attr:`reports` holds every member's (when every member
        offered one), read from the member list the leader publishes anyway. So the training
        loop's settle -- an exchange of each member's step and plan -- rides on the
        rendezvous's round trips instead of a first all-reduce on the new group: at 32 groups
        on 2 cores that all-reduce (a ring of 62 hops, its pairs connecting on first use)
        took 0.11-0.15 s of a 0.55 s hang -> commit (bench/recovery_scaling.py)."""
        self._rdzv.offer(report)

    @property
    def reports(self) -> tuple[int, dict[int, Any]] | None:
        """What every member of the last generation formed offered: (generation, {uid:
        report}); None when one of them offered nothing."""
        return self._rdzv.reports

    def reform(self, expect: list[int] | tuple[int, ...] = (), *,
               planned: bool = False) -> list[int]:
        """Form generation g+1 among the live members and return its member list.

        ``expect``: uids of joining processes this member admits into g+1 (each joiner calls
        :meth:`join` with g+1). Members may disagree (one that is recovering from a failed op
        knows nothing of an admission its peers started): the leader waits for the union of
        what the members that joined expect, as for live members, and drops those that have
        not registered by the deadline.

        ``planned``: a re-form at a step boundary (an admission), not a failure. The old
        generation is then *not* aborted: a peer still receiving the last chunks of the op
        this member already completed finishes it too, instead of abandoning an op its peers
        committed. After a failure (``planned=False``) the old generation is aborted so that
        every member stops waiting in it.

        Raises :class:`RendezvousError` when the rendezvous times out or this worker was left
        out of the new generation.
        """
        if self.store_lost:
            raise StoreLostError("the coordinator's store is gone: no new generation can form")
        old = self._gen
        old_members = list(self._members)
        gen = old + 1
        t_start = time.monotonic()
        if not planned:
            self._set_abort(old, self._abort_reason or "reform requested")
        # why the old generation broke, as this member saw it ("stale heartbeat: [3]", a gloo
        # error, a peer's flag): the runner journals it with its re-plan
        self.last_cause = None if planned else self._abort_reason
        detected_at = self._detected_at or time.time()

        try:
            new, leader = self._rdzv.form(gen, expect, t_start, planned)
        except StoreLostError:
            self.store_lost = True
            raise
        t_rdzv = time.monotonic()
        if self.on_rendezvous is not None:
            hook, self.on_rendezvous = self.on_rendezvous, None
            hook()
        try:
            self._enter(gen, new)
        except RuntimeError as exc:  # a member never came to the process group (it hung or
            # died during the re-form): the generation is broken before its first op, and the
            # caller's next op fails at once and re-forms without it (its heartbeat is stale)
            with self._lock:
                self._gen, self._members = gen, new
                self._abort_reason, self._detected_at = None, None
            self._set_abort(gen, f"gen {gen}: process group not formed: {short_error(exc)}")
            self._note_detect(self._abort_reason or "process group not formed")
        t_pg = time.monotonic()
        ev = {
            "event": Event.REFORM, "gen": gen, "members": new, "leader": leader, "planned": planned,
            "dropped": [u for u in old_members if u not in new], "cause": self.last_cause,
            "detected_at": detected_at,
            "rendezvous_s": round(t_rdzv - t_start, 4),
            "pg_init_s": round(t_pg - t_rdzv, 4),
            "ready_at": time.time(),
        }
        ev["recovery_s"] = round(ev["ready_at"] - detected_at, 4)
        self.journal.append(ev)
        return list(new)

    def join(self, gen: int, timeout: float | None = None) -> list[int]:
        """Joining side of an admission: enter generation ``gen`` (named by the members).

        Registers, waits for the leader's member list and builds the process group. Raises
        :class:`RendezvousError` if the list does not come or does not include this worker.
        """
        new = self._rdzv.join(gen, timeout)
        t0 = time.monotonic()
        try:
            self._enter(gen, new)
        except RuntimeError as exc:  # a member never came: the launcher sends this joiner again
            raise RendezvousError(
                f"gen {gen}: process group not formed: {short_error(exc)}") from exc
        self.journal.append({"event": Event.JOIN, "gen": gen, "members": new,
                             "pg_init_s": round(time.monotonic() - t0, 4), "t": time.time()})
        return list(new)

    def _enter(self, gen: int, new: list[int]) -> None:
        """Build generation ``gen``'s process group and make it current."""
        self._rdzv.build(gen, new, self._members)
        with self._lock:
            self._gen = gen
            self._members = new
            self._wake.clear()
            self._abort_reason = None
            self._detected_at = None
        if self._aborted_gen >= gen:  # raced: the new generation already broke
            self._wake.set()

    # ------------------------------------------------------------------ heartbeat
    def live_now(self, staleness: float | None = None) -> list[int]:
        """Current members judged live from this worker's heartbeat observations."""
        return self._hb.live(self.members, staleness or self._staleness())

    def _staleness(self) -> float:
        return self.staleness if self._warm else self.startup_staleness

    def watch(self, keys) -> None:
        """Have the heartbeat thread read these store counters every period (``watched``):
        control values a training loop needs at step boundaries, without a store round trip
        on the step's critical path."""
        self._hb.watch(keys, self.store)

    def beat_report(self, window: float = 5.0) -> dict[str, Any]:
        """This member's own heartbeat over the last ``window`` s: the gaps between its beats
        (the silence since the last one included), the longest wait to wake up and round
        trip, and where its main thread was at each late beat (the ``left_out`` event)."""
        return self._hb.report(window)

    @property
    def monitor_errors(self) -> int:
        """The heartbeat's failed beats so far (store hiccups)."""
        return self._hb.errors

    def _current(self) -> tuple[int, list[int]]:
        """The generation and its members, read together (the heartbeat thread's view)."""
        with self._lock:
            return self._gen, list(self._members)

    def _store_gone(self) -> None:
        """The heartbeat got no answer from the store three periods in a row."""
        self.store_lost = True
        self._wake.set()  # a waiting op judges what that means for it

    def _supervisor_silent(self, silent: float) -> None:
        """The heartbeat found the supervisor's heartbeat silent for ``silent`` s."""
        if not self.supervisor_lost:
            self.supervisor_lost = True
            self.journal.append({"event": Event.SUPERVISOR_SILENT, "silent_s": round(silent, 3),
                                 "t": time.time()})

    def _sibling_lost(self, rank: int, silent: float) -> None:
        """Rank ``rank`` of this member's group went silent (hung, or dead before anyone
        posted its death): the group cannot step any more (its collectives wait for that
        rank), so this rank fences it (:meth:`fence_group`). From the heartbeat thread: the
        main thread may be blocked in the group's collective with the silent rank."""
        self.fence_group(f"rank {rank} of the group silent for {silent:.2f} s", sibling=rank)

    def fence_group(self, reason: str, sibling: int | None = None) -> None:
        """Fence this member's group and leave: a death notice for the group, read by every
        plane's members at once, then exit 11 (``GROUP_FENCED``); the launcher kills the
        group's other ranks and replaces it whole. The reason goes first to ``on_fence`` (the
        worker's journal) and to stderr: an exit code alone left a group fenced at start-up
        under load with nothing to say which rule fired."""
        ev = {"event": Event.GROUP_FENCED, "gen": self._gen, "rank": self.plane,
              "reason": reason, "t": time.time()}
        if sibling is not None:
            ev["sibling"] = sibling
        try:
            # this rank's own beats: a rank fenced by a sibling that found *it* silent shows
            # here whether it was stopped or starved, and where its main thread was
            ev.update(self.beat_report())
            if self.on_fence is not None:
                self.on_fence(ev)
            sys.stderr.write(f"group {self.uid} rank {self.plane}: fencing the group: "
                             f"{reason}\n")
            sys.stderr.flush()
        except Exception:  # the exit matters more than its note
            pass
        try:
            declare_dead(self.store, self.uid)
        except Exception:  # no store: the peers find this rank silent as well
            pass
        os._exit(int(ExitCode.GROUP_FENCED))

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop the heartbeat. Does not exit the process (use ``os._exit`` in entry points)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        self._hb.close()

    def __enter__(self) -> FTComm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
