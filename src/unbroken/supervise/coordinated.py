"""The supervisor's side of ``--store etcd://...``: check, lead, record, hand over.

Why a file of its own: the supervisor (``supervise.supervisor``) runs a job the same way
whatever holds the durable state; this file is everything that changes when etcd holds it.

* :func:`open_job` -- before any process starts: the etcd cluster must answer, the job's
  prefix must be free or hold this very job (``core.coordination.same_job``), and an active
  supervisor must win the lease (a second one is told to start with ``--standby``). Each
  failure is one line (``UsageError``, exit 2) and nothing is started.
* :class:`JobCoordinator` -- while the job runs: keeps the lease (``coord.lease``), records the
  durable changes the supervisor sees in the journal -- a new generation (its members and
  plan) and the committed-step watermark at each durable checkpoint -- in leader-guarded
  transactions (``coord.jobstate``). Per-step commits are never written to etcd: the filter
  is one dict lookup per event. A lost lease (expired, deposed) sets :attr:`lost`; from then
  on the supervisor must not act. Run from the command line it becomes a standby of its own
  job (:func:`stand_by_again`: it re-executes itself with ``--standby --rejoin``), so its
  store goes, the members pause at one committed step and wait, and whoever holds the lease
  next -- this process once etcd has a quorum again, or another standby -- adopts them. As a
  library (no re-exec possible) it stops its job with a checkpoint instead.
* A standby (``--standby``) calls :meth:`JobCoordinator.stand_by`: it waits until the active
  supervisor's lease expires (``core.coordination.takeover``) and takes it. Each attempt's
  store is named in etcd (:meth:`JobCoordinator.publish_store`); the members (started with
  ``--etcd``) outlive their supervisor, stop at one committed step when its store goes, and
  re-attach to the standby's store (``runtime.reattach``), which adopts them where they
  stopped (``supervise.adopt``): no restart, no step lost. When nobody re-attaches it
  continues from the newest durable checkpoint in the shared ``--out``.

Node agents (``--nodes``) started with ``--store`` find the job's directory in etcd
(:meth:`JobCoordinator.publish_directory`) and follow it to the standby's, keeping the workers
it adopts (``NodeCluster.adopt``). Groups of several ranks re-attach rank by rank and are
adopted whole (``supervise.adopt.collect``). With ``--local-nodes`` the agents are the
supervisor's children and die with it: there the standby restarts from the checkpoint. The
spare pool and the guard's eviction history are recorded as they change; a standby restores
the exclusions.
When etcd is unavailable the pending fields wait (newer values replacing older ones) and are
retried, once a line says so; training itself does not wait on etcd.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Callable

from unbroken.cliargs import UsageError
from unbroken.coord.etcd import Etcd, EtcdError
from unbroken.coord.jobstate import EtcdJobState, NotLeader, OtherJob
from unbroken.coord.lease import LeaseKeeper, wait_for_lease
from unbroken.core.coordination import StoreURL
from unbroken.events import Event
from unbroken.protocol import COORD_EPOCH

__all__ = ["JobCoordinator", "open_job", "job_identity", "stand_by_again"]


def job_identity(spec) -> dict:
    """What makes a job the same job: a standby started with the same flags has the same."""
    return {"trainer": getattr(spec, "trainer", "demo"), "groups": spec.groups,
            "steps": spec.steps, "seed": spec.seed, "redundancy": spec.ft.redundancy,
            "out": os.path.abspath(spec.out),
            "trainer_args": getattr(spec, "trainer_args", {})}


class JobCoordinator:
    """The durable state of one job in etcd, as its (active or standby) supervisor holds it."""

    def __init__(self, store: StoreURL, state: EtcdJobState, ttl: int,
                 line: Callable[[str], None]) -> None:
        self.store, self.state, self.ttl, self.line = store, state, ttl, line
        self.keeper: LeaseKeeper | None = None
        self.reattach_timeout = 60.0  # the members' wait for a standby (--reattach-timeout)
        self.generation = 0
        self._pending: dict = {}  # fields not recorded yet (written by _write_loop)
        self._cv = threading.Condition()
        self._closing = False
        self._writer: threading.Thread | None = None

    @property
    def lost(self) -> bool:
        return self.keeper is not None and self.keeper.lost.is_set()

    def stand_by(self, stopped: Callable[[], bool], store: int | None = None,
                 host: str = "127.0.0.1") -> bool:
        """Wait for the lease (a standby): True once held, False if the job finished.
        ``store``: the port of this standby's store, up already, at ``host``: announced with
        it, the members connect to it ahead (``runtime.reattach``)."""
        try:  # the operator's view: a warm standby waits (renewed each round of the wait)
            self.state.announce({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.time(),
                                 **({"store": {"host": host, "port": store}}
                                    if store else {})}, max(5, 3 * self.ttl))
        except EtcdError as e:
            self.line(f"standby: not announced in etcd: {e}")
        move = "stop"
        try:
            move, why = wait_for_lease(self.state, self.ttl, stopped=stopped,
                                       on_move=lambda m, w: self.line(f"standby: {w}"),
                                       tick=self.state.still_here)
        finally:
            if move != "take":  # taking over: kept until the members have connected
                self.withdraw()
        self.line(f"standby: {why}")
        return move == "take"

    def withdraw(self) -> None:
        """This standby's announcement goes (its members connected, or it stopped)."""
        try:
            self.state.withdraw()
        except EtcdError:
            pass  # its own lease ends it

    def start(self) -> None:
        self.keeper = LeaseKeeper(self.state.etcd.endpoints, self.state.lease, self.ttl)
        self._writer = threading.Thread(target=self._write_loop, name="etcd-record",
                                        daemon=True)
        self._writer.start()
        self._record(status="running")

    def publish_store(self, store, port: int, host: str = "127.0.0.1") -> str:
        """Name this attempt's store in etcd (``store_addr``: host, port, a fresh epoch), and
        the epoch in the store itself: a member whose store goes away re-attaches to the next
        store of another epoch (``runtime.reattach``). The store first (the members block on
        it at start-up), etcd through the writer (training does not wait on etcd)."""
        import uuid

        epoch = uuid.uuid4().hex
        store.set(COORD_EPOCH, epoch)
        self._record(store_addr={"host": host, "port": int(port), "epoch": epoch,
                                 "leader": self.state.me})
        return epoch

    def publish_directory(self, host: str, port: int) -> None:
        """Name the job's node directory in etcd (``directory``: host, port, a fresh epoch):
        agents started with ``--store`` claim their node there, and after a takeover in the
        standby's (``nodes.agent``)."""
        import uuid

        self._record(directory={"host": host, "port": int(port), "epoch": uuid.uuid4().hex,
                                "leader": self.state.me})

    def agent_flags(self) -> str:
        """What a node agent is started with to follow this job through etcd."""
        return f"--store etcd://{','.join(self.store.endpoints)} --job {self.state.job}"

    def worker_argv(self) -> list[str]:
        """The members' flags that let them outlive this supervisor (``runtime.reattach``)."""
        return ["--etcd", "etcd://" + ",".join(self.store.endpoints), "--job", self.state.job,
                "--reattach-timeout", f"{self.reattach_timeout:g}"]

    def on_event(self, ev: dict) -> None:
        """The supervisor's journal, event by event: only durable changes go to etcd, and
        from a thread of their own (an etcd election must not stall the supervisor's loop)."""
        kind = ev.get("event")
        if kind in (Event.REPLAN, Event.ADMIT, Event.WIPEOUT) and "gen" in ev:
            gen = int(ev["gen"])
            if gen > self.generation:  # every member journals it: record the first
                self.generation = gen
                self._record(generation=gen, members=ev.get("members", []),
                             plan={"step": ev.get("step"), "depth": ev.get("depth"),
                                   "reason": ev.get("reason")})
        elif kind == Event.SPARES:
            self._record(spares={"pool": ev.get("pool", []), "pids": ev.get("pids", {})})
        elif kind == Event.EXCLUSIONS:
            self._record(exclusions=ev.get("exclusions", {}))
        elif kind == Event.CHECKPOINT and "step" in ev:
            self._record(committed=f"{self.generation}:{int(ev['step'])}",
                         ledger_head=int(ev["step"]))

    def _record(self, **fields) -> None:
        with self._cv:
            self._pending.update(fields)  # newer values of a field replace older ones
            self._cv.notify()

    def _write_loop(self) -> None:
        said = False
        while True:
            with self._cv:
                while not self._pending and not self._closing:
                    self._cv.wait()
                if not self._pending:
                    return
                fields = dict(self._pending)
            try:
                self.state.write(**fields)
            except NotLeader as e:
                self.line(f"etcd: {e}")
                if self.keeper is not None:
                    self.keeper.lost.set()  # somebody else leads: stop acting
                return
            except EtcdError as e:  # no quorum: keep the fields, try again
                if not said:
                    self.line(f"etcd unavailable, the durable state waits: {e}")
                said = True
                with self._cv:
                    self._cv.wait(0.2)  # a retry interval (or an earlier close)
                continue
            said = False
            with self._cv:
                for k, v in fields.items():
                    if self._pending.get(k) == v:
                        del self._pending[k]
                self._cv.notify_all()

    def close(self, finished: bool, flush_s: float = 10.0) -> None:
        """Record the end (``done`` when ``finished``) and give the lease up; waits up to
        ``flush_s`` for etcd to take what is pending (then the lease is left to expire)."""
        if self._writer is not None:
            if finished and not self.lost:  # its spares went with it
                self._record(status="done", spares={"pool": [], "pids": {}})
            deadline = time.monotonic() + flush_s
            with self._cv:
                while self._pending and self._writer.is_alive() and \
                        time.monotonic() < deadline:
                    self._cv.wait(0.1)
                self._closing = True
                self._cv.notify_all()
            self._writer.join(timeout=2)
        if self.keeper is not None:
            self.keeper.stop()
        try:
            if not self.lost:
                self.state.release()  # a clean end: a standby need not wait out the TTL
        except EtcdError as e:
            self.line(f"etcd: the lease is left to expire: {e}")


def stand_by_again(argv: list[str]) -> Callable[[], None]:
    """What a command-line supervisor does when it loses its lease: become a standby of its
    own job, in the same process (pid, parent, terminal and ``--out`` stay), by executing
    ``unbroken`` again with ``argv`` plus ``--standby --rejoin``. The exec closes the old
    store (its sockets are close-on-exec), so every member stops after the same committed
    step and waits for a store in etcd (``runtime.reattach``); nothing of the deposed
    supervisor's memory can act on the job afterwards."""
    extra = [f for f in ("--standby", "--rejoin") if f not in argv]

    def go() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "unbroken", *argv, *extra])
    return go


def open_job(store: StoreURL, job: str, identity: dict, *, standby: bool, ttl: int,
             line: Callable[[str], None], rejoin: bool = False) -> JobCoordinator:
    """Connect, claim the job's prefix and (active) take the lease; ``UsageError`` (one line,
    nothing started) when the cluster does not answer, the prefix is another job's, or another
    supervisor leads this one. ``rejoin``: a supervisor that lost the lease of this very job
    (:func:`stand_by_again`) stands by without these checks -- etcd may have no quorum now,
    and the wait for the lease tolerates that."""
    url = "etcd://" + ",".join(store.endpoints)
    etcd = Etcd(list(store.endpoints), timeout=1.0)
    if rejoin and standby:
        me = f"{socket.gethostname()}:{os.getpid()}:rejoined"
        return JobCoordinator(store, EtcdJobState(etcd, job, me), ttl, line)
    try:
        etcd.status()
    except EtcdError as e:
        raise UsageError(f"--store {url}: {e}") from None
    state = EtcdJobState(etcd, job, f"{socket.gethostname()}:{os.getpid()}")
    try:
        state.claim_job(identity)
        if not standby:
            ok, why = state.acquire(ttl)
            if not ok:
                raise UsageError(f"--job {job}: {why}; start this one with --standby")
    except OtherJob as e:
        raise UsageError(f"--store {url} --job {job}: {e}") from None
    except EtcdError as e:
        raise UsageError(f"--store {url}: {e}") from None
    return JobCoordinator(store, state, ttl, line)
