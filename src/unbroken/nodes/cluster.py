"""The coordinator's side of the node agents: :class:`NodeCluster`.

Why a cluster class and not a second supervisor: the supervisor, the guard and the ladder
already work against one surface (``StackedCluster``: ``procs[uid]`` with the ``Popen``
methods, ``spawn``, ``assign``, ``store``, ``close``). ``NodeCluster`` keeps that surface and
only changes where a worker runs: ``procs[uid]`` is a :class:`RemoteProc` whose ``poll`` /
``wait`` / ``send_signal`` are backed by the agent's store records and orders, and whose
``sentinel`` becomes readable when the agent reports the exit, so the supervisor's
``ExitWaiter`` sleeps on remote deaths exactly as on local ones. Nothing else changes.

One ``NodeCluster`` is one attempt of the job: it posts its store to the job's directory
(``nodes.directory``, which the agents follow from attempt to attempt) and waits until every
live node's agent attached. A watcher thread (its own store clients) turns the agents' records
into exits, and declares a node lost when its agent process ended (local nodes: the
coordinator started it, the exit is seen at once) or its heartbeat in the directory went
silent (``core.nodes.stale_nodes``: a cut-off, stopped or dead agent elsewhere). A lost node's
processes are declared dead at once (the survivors mask them), ``node_fenced/<i>`` is set in
this attempt's store (its workers leave) and in the directory (the node stays lost for the
job), and a ``node_lost`` event is queued for the supervisor's journal (:meth:`drain_events`).
A fenced agent that asks to rejoin and beats again gets its fence lifted
(``core.nodes.rejoining``): spares may go there again (``node_rejoined``). Once a second the
watcher also reads each live node's machine sample and new XID records (``nodes.health``) and
queues them (``node_health``, ``node_xid``) for the supervisor, which hands them to the guard.

Placement: group g runs on node ``node_of[g]`` (``core.nodes.on_live_nodes``); a warm spare
on the least loaded live node with room left (``core.nodes.spare_node``). A group of several
ranks is placed whole: its ranks (each a ``RemoteProc`` keyed ``"<uid>.<rank>"``, wrapped
in a ``RankGroup`` as on one machine) go to its rank 0's node, a node's ``--slots`` counts
groups, and a lost node takes every rank of its groups. Stack dumps for the stall vote are
taken by each worker's own agent (:meth:`dump_stacks`; rank 0 of a group of several).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from datetime import timedelta

from unbroken.core.membership import beat_clock, observe, starved_observer
from unbroken.core.nodes import rejoining, spare_node, stale_nodes
from unbroken.events import Event
from unbroken.nodes.health import HEALTH_S
from unbroken.procwait import close_quietly, readable
from unbroken.protocol import (NODE_EXITS, group_of, node_exit_key, node_fenced_key,
                               node_hb_key, node_health_key, node_key, node_left_key,
                               node_order_key, node_orders_key, node_pid_key, node_rejoin_key,
                               node_stacks_key, node_xid_key, node_xids_key, rank_proc)
from unbroken.supervise.local import StackedCluster

__all__ = ["NodeCluster", "RemoteProc"]


class RemoteProc:
    """A worker on a node: the ``Popen`` surface the supervisor uses, backed by its agent."""

    def __init__(self, cluster: "NodeCluster", uid: int, node: int) -> None:
        self.cluster, self.uid, self.node = cluster, uid, node
        self.args = [f"node {node} uid {uid}"]
        self.returncode: int | None = None
        self.sentinel, self._w = os.pipe()  # readable once the exit is known (ExitWaiter)
        self._pid: int | None = None

    @property
    def pid(self) -> int:
        """The worker's pid on its node (posted by the agent right after it started it)."""
        if self._pid is None:
            st, key = self.cluster.store, node_pid_key(self.uid)
            deadline = time.monotonic() + 60
            while not st.check([key]):
                if self.returncode is not None or time.monotonic() > deadline:
                    return -1  # its node went before it started
                readable([self.sentinel], 0.02)  # or until it is known dead
            self._pid = int(st.get(key))
        return self._pid

    def _exited(self, rc: int) -> None:
        if self.returncode is None:
            self.returncode = int(rc)
            os.write(self._w, b"x")

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not readable([self.sentinel], timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.cluster.order(self.node, {"op": "signal", "uid": self.uid, "sig": int(sig)})

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def __del__(self) -> None:  # getattr: __init__ failed before its pipe (seen: EMFILE)
        close_quietly(getattr(self, "sentinel", None), getattr(self, "_w", None))


class NodeCluster(StackedCluster):
    """``StackedCluster`` whose workers run under node agents, for one attempt of the job.

    ``directory``: the job's :class:`~unbroken.nodes.directory.NodeDirectory` (the agents, the
    fences, the attempts); ``node_of``: group -> node (``core.nodes.on_live_nodes``, over the
    nodes the directory still has live); ``out``: the run directory every node must see."""

    WORKER = "unbroken.runtime.stacked_worker:worker_main"
    TICK_S = 0.02

    def __init__(self, cfg, journal_dir: str, *, directory, node_of: list[int], out: str = "",
                 node_staleness: float = 1.0, **kw) -> None:
        self.directory, self.out = directory, out
        self.nodes = directory.count
        self.node_of_group = list(node_of)
        self.node_staleness, self.node_heartbeat = node_staleness, directory.heartbeat
        self.node_of: dict[int, int] = {}  # group uid -> node
        self.remote: dict[int | str, RemoteProc] = {}  # every rank's process (rank_proc key)
        self.agents = directory.agents  # local agents: node -> process
        self.lost: dict[int, str] = dict(directory.fenced)  # node -> why
        self.room: dict[int, int] = {}  # node -> the processes its agent may run
        self._fenced_at: dict[int, int] = {}  # lost node -> its heartbeat counter then
        self._events: list[dict] = []
        self._health_seen: dict[int, object] = {}  # node -> its last sample's time
        self._xids_seen: dict[int, int] = {}  # node -> XID records read
        self._order_lock = threading.Lock()
        self._orders: dict[int, int] = {}
        self._watcher: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe()
        kw.setdefault("store_process", True)
        # a standby's cluster: the agents' running workers are adopted (:meth:`adopt`), not
        # dropped when the agents attach
        self._adopting = kw.get("adopt_from") is not None
        try:
            super().__init__(cfg, journal_dir, **kw)
        except BaseException:  # the agents refused the job: nothing of this attempt stays
            if getattr(self, "store_host", None) is not None:
                self.store_host.kill()
                self.store_host.wait(timeout=10)
            for fd in (self._stop_r, self._stop_w):
                os.close(fd)
            raise

    # ------------------------------------------------------------------ agents
    def _start_agents(self) -> None:
        """Check the agents' room against the placement, post this attempt to the directory
        and wait until every live node's agent attached to this attempt's store."""
        from unbroken.core.nodes import check_room
        from unbroken.nodes.directory import NodeSetupError

        claims = self.directory.claims()
        live = [k for k in range(self.nodes) if k not in self.lost]
        slots = {k: claims[k].get("slots") for k in live}
        spare_room = {k: claims[k].get("spares") for k in live}
        problem = check_room(self.node_of_group, len(self.spares), slots, spare_room)
        if problem is not None:
            raise NodeSetupError(problem)
        for k in live:
            if slots[k] is not None and spare_room[k] is not None:
                self.room[k] = slots[k] + spare_room[k]
        self.directory.publish(self.port, self.out)
        self.directory.await_nodes(lambda k: self.store.check([node_key(k)]), live,
                                   "attached to the attempt")
        if not self._adopting:  # what the agents still run of the last attempt goes
            for k in live:
                self.order(k, {"op": "adopt", "uids": []})
        self._watcher = threading.Thread(target=self._watch, name="node-watch", daemon=True)
        self._watcher.start()

    def adopt(self, members, pids: dict[int, list[int]],
              nodes: dict[int, int | None] | None = None) -> None:
        """Take over the members a lost coordinator's agents still run (``supervise.adopt``):
        ``pids[uid]``, its ranks' pids, ``nodes[uid]`` the node whose agent started them
        (their re-attach reports). Each agent is told which of its workers stay (``adopt``
        order: it reports their exits to this attempt from now on) and kills the others;
        a member without pids, or on a node lost meanwhile, is handed over as dead."""
        from unbroken.supervise.rankgroup import RankGroup

        if self._watcher is None:
            self._start_agents()
        r, keep = self.cfg.ranks_per_group, {}
        for u in members:
            node, got = (nodes or {}).get(u), pids.get(u)
            ok = bool(got) and node is not None and node not in self.lost
            self.node_of[u] = node if ok else -1
            procs = []
            for k in range(r):
                key = rank_proc(u, k, r)
                p = self.procs[key] = self.remote[key] = RemoteProc(self, key, self.node_of[u])
                if ok:
                    p._pid = int(got[k])
                    keep.setdefault(node, []).append(key)
                else:
                    p._exited(-signal.SIGKILL)
                procs.append(self.procs.pop(key) if r > 1 else p)
            if r > 1:
                self.procs[u] = RankGroup(procs, on_lost=lambda u=u: self._lost_notice(u))
            self.uids.append(u)
        for k in range(self.nodes):
            if k not in self.lost:
                self.order(k, {"op": "adopt", "uids": keep.get(k, [])})

    def drop_paused(self, reports: dict[int, dict]) -> None:
        """Nothing adopted: their pids are other machines'; their agents stop them (the next
        attempt's ``adopt []`` order, or this one's ``exit`` at :meth:`close`)."""

    def order(self, node: int, order: dict, store=None) -> None:
        """Post ``order`` to ``node``'s agent (it reads them in sequence); ``store``: the
        calling thread's own client (default: the main thread's)."""
        st = store or self.store
        with self._order_lock:
            n = self._orders[node] = self._orders.get(node, 0) + 1
            st.set(node_order_key(node, n), json.dumps(order))
            st.add(node_orders_key(node), 1)

    def dump_stacks(self, uid: int, timeout: float = 10.0):
        """Worker ``uid``'s stacks, taken by its own node's agent (py-spy there: the
        coordinator cannot ptrace another machine's process) -> a ``detect.stacks.Dump``.
        Called from the supervisor's stall thread: its own store client."""
        from unbroken.detect.stacks import FAILED, Dump

        st = self.store.clone()
        with self._order_lock:
            self._dumps = getattr(self, "_dumps", 0) + 1
            n = self._dumps
        node = self.node_of.get(uid, -1)
        t0 = time.perf_counter()
        try:
            if node < 0 or node in self.lost:
                raise RuntimeError(f"uid {uid}: its node {node} is lost")
            key = rank_proc(uid, 0, self.cfg.ranks_per_group)
            self.order(node, {"op": "dump", "uid": key, "n": n}, store=st)
            st.wait([node_stacks_key(key, n)], timedelta(seconds=timeout))
            d = json.loads(st.get(node_stacks_key(key, n)))
        except Exception as exc:
            err = f"uid {uid} on node {node}: no dump ({str(exc).splitlines()[0][:120]})"
            return Dump(-1, FAILED, f"<dump failed: {err}>", time.perf_counter() - t0, err)
        return Dump(self.procs[uid].pid, d["method"], d["text"], float(d["seconds"]),
                    d.get("error", ""))

    def _start(self, uid: int, entry: str, argv: list[str]) -> None:
        if entry != self.WORKER:
            raise ValueError(f"a node agent starts {self.WORKER} only, not {entry}")
        if self._watcher is None:
            self._start_agents()
        g = group_of(uid)
        if g in self.node_of:  # a later rank of a group: where its rank 0 went
            node = self.node_of[g] if self.node_of[g] >= 0 else None
        elif g < self.cfg.groups:
            node = self.node_of_group[g]
        else:
            load: dict[int, int] = {}
            for u, k in self.node_of.items():
                if self._alive(u):
                    load[k] = load.get(k, 0) + 1
            node = spare_node(load, [k for k in range(self.nodes) if k not in self.lost],
                              self.room)
        self.node_of[g] = node if node is not None else -1
        proc = self.procs[uid] = self.remote[uid] = RemoteProc(self, uid, self.node_of[g])
        if node is None or node in self.lost:
            proc._exited(-signal.SIGKILL)  # no node left to run it
            return
        self.order(node, {"op": "spawn", "uid": uid, "argv": argv,
                          "stderr": self._errpath(uid)})

    def uids_on(self, node: int) -> list[int]:
        return sorted(u for u, k in self.node_of.items() if k == node)

    def _ranks(self, uid: int) -> list[RemoteProc]:
        """Group ``uid``'s rank processes (one for a group of one rank)."""
        r = self.cfg.ranks_per_group
        return [self.remote[rank_proc(uid, k, r)] for k in range(r)
                if rank_proc(uid, k, r) in self.remote]

    def _alive(self, uid: int) -> bool:
        """Any rank of group ``uid`` still running, as far as its agent reported."""
        return any(p.returncode is None for p in self._ranks(uid))

    def kill_node(self, node: int) -> list[int]:
        """Fault injection (``node:I@S``): SIGKILL local agent ``node`` with its process group
        (its fork server); its workers follow by ``PR_SET_PDEATHSIG``. Returns the uids that
        were running there."""
        running = [u for u in self.uids_on(node) if self._alive(u)]
        self.directory.kill_node(node)
        return running

    def cut_node(self, node: int) -> list[int]:
        """Fault injection (``cut:I@S``): SIGSTOP local agent ``node`` only; its workers run
        on, so only its silent heartbeat tells. Returns the uids running there."""
        running = [u for u in self.uids_on(node) if self._alive(u)]
        self.directory.cut_node(node)
        return running

    def drain_events(self) -> list[dict]:
        """Node events since the last call (for the supervisor's journal)."""
        with self._order_lock:
            out, self._events = self._events, []
        return out

    # ------------------------------------------------------------------ the watcher
    def _watch(self) -> None:
        st = self.store.clone()
        hb = self.directory.store.clone()  # the agents beat in the directory (job-long)
        obs: dict = {}
        beats, exits_seen = 0.0, 0
        last_judged = health_due = time.monotonic()
        while True:
            fds = [self._stop_r] + [a.sentinel for k, a in self.agents.items()
                                    if k not in self.lost]
            if self._stop_r in readable(fds, self.TICK_S):
                return
            try:
                for k, a in list(self.agents.items()):
                    if k not in self.lost and a.poll() is not None:
                        self._node_lost(st, k, f"its agent exited (code {a.returncode})")
                n = int(st.add(NODE_EXITS, 0))
                if n != exits_seen:
                    exits_seen = n
                    for u, p in list(self.remote.items()):
                        if p.returncode is None and st.check([node_exit_key(u)]):
                            p._exited(int(st.get(node_exit_key(u))))
                now = time.monotonic()
                if now - last_judged < self.node_heartbeat:
                    continue
                live = [k for k in range(self.nodes) if k not in self.lost]
                counters = {k: int(hb.add(node_hb_key(k), 0)) for k in live}
                obs, _starved = starved_observer(obs, last_judged, now, self.node_staleness,
                                                 beats)
                beats += beat_clock(obs, counters)
                obs = observe(obs, counters, now, beats)
                last_judged = now
                for k in stale_nodes({k: obs[k] for k in live}, now, self.node_staleness,
                                     beats, self.node_heartbeat):
                    silent = now - obs[k][1]
                    self._node_lost(st, k, f"its heartbeat was silent for {silent:.2f}s",
                                    int(counters[k]))
                self._rejoins(st, hb)
                if now >= health_due:
                    health_due = now + HEALTH_S
                    self._read_health(st, live)
            except Exception:  # the store is going away (close): nothing left to watch
                if self._stop_r in readable([self._stop_r], 0):
                    return

    def _read_health(self, st, live: list[int]) -> None:
        """The live nodes' latest machine samples and their new XID records, queued as
        ``node_health`` and ``node_xid`` events (``nodes.health``)."""
        out = []
        for k in live:
            if st.check([node_health_key(k)]):
                sample = json.loads(st.get(node_health_key(k)))
                if sample.get("t") != self._health_seen.get(k):
                    self._health_seen[k] = sample.get("t")
                    out.append({"event": Event.NODE_HEALTH, "node": k, **sample})
            n = int(st.add(node_xids_key(k), 0))
            while self._xids_seen.get(k, 0) < n:
                self._xids_seen[k] = i = self._xids_seen.get(k, 0) + 1
                rec = json.loads(st.get(node_xid_key(k, i)))
                out.append({"event": Event.NODE_XID, "node": k, **rec, "t": time.time()})
        if out:
            with self._order_lock:
                self._events.extend(out)

    def _rejoins(self, st, hb) -> None:
        """Fenced nodes whose agent asked to rejoin (``--rejoin``) and beats again come back
        as spare capacity (``core.nodes.rejoining``): the fence is lifted (this attempt's
        store first: the agent re-reads it when it re-attaches) and spares may go there."""
        if not self.lost:
            return
        for k in self.lost:  # fenced before this attempt: its counter from the first look
            if k not in self._fenced_at:
                self._fenced_at[k] = int(hb.add(node_hb_key(k), 0))
        asked = [k for k in self.lost if hb.check([node_rejoin_key(k)])]
        if not asked:
            return
        back, why = rejoining(asked, self._fenced_at,
                              {k: int(hb.add(node_hb_key(k), 0)) for k in asked})
        for k in back:
            st.delete_key(node_fenced_key(k))
            self.directory.rejoin(k)
            del self.lost[k], self._fenced_at[k]
            with self._order_lock:
                self._events.append({"event": Event.NODE_REJOINED, "node": k, "reason": why,
                                     "t": time.time()})

    def _node_lost(self, st, node: int, why: str, counter: int | None = None) -> None:
        from unbroken.runtime.ftcomm import declare_dead

        if node in self.lost:
            return
        self.lost[node] = why
        if counter is not None:
            self._fenced_at[node] = counter  # a rejoin needs the heartbeat past this
        t = time.time()
        st.set(node_fenced_key(node), why)  # its workers leave (stacked_worker._fence)
        self.directory.fence(node, why)  # ... and its agent, for the rest of the job
        gone = []
        for u in self.uids_on(node):
            if self._alive(u):
                declare_dead(st, u)  # the survivors drop it now
                gone.append(u)
        for u in gone:
            for p in self._ranks(u):
                p._exited(-signal.SIGKILL)
        with self._order_lock:
            self._events.append({"event": Event.NODE_LOST, "node": node, "reason": why,
                                 "uids": gone, "t": t})

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """End the attempt: every live agent kills and reaps its workers and leaves this
        store (``node_left/<i>``) before it goes; the agents themselves follow the job."""
        os.write(self._stop_w, b"x")
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        told = [k for k in range(self.nodes) if k not in self.lost and k in self._orders]
        for k in told:
            try:
                self.order(k, {"op": "exit"})
            except Exception:
                told.remove(k)
        self.directory.await_nodes(lambda k: self.store.check([node_left_key(k)]), told,
                                   "left the attempt", strict=False, timeout=10)
        for p in self.remote.values():
            p._exited(-signal.SIGKILL)
        super().close()
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
