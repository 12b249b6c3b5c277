"""The node agent: ``unbroken agent --coordinator HOST:PORT | --store etcd://... [--job NAME]
[--node I] [--slots K] [--spares K]``.

Why an agent: across machines the supervisor can neither fork a worker nor ``waitpid`` one, so
each machine runs one agent that does both for it and talks to the coordinator through the
stores the coordinator already hosts (no second protocol):

* ``HOST:PORT`` is the job's *directory* (``unbroken.nodes.directory``): a store that lives
  as long as the job. The agent claims ``node/<i>`` there with ``compare_set`` (a second agent
  for the same index, or an index past the job's nodes: one line, exit 2) and beats
  ``node_hb/<i>`` from a thread of its own, so a stopped (cut-off) agent stops beating and
  the coordinator declares the node lost (``core.nodes.stale_nodes``);
* each attempt of the job (a wipe-out restart is a new one, with a new store) is posted to
  the directory (``job/attempts``, ``job/attempt/<n>``); the agent attaches to the attempt's
  store on the directory's host and leaves it when the attempt ends, so it outlives restarts;
* in an attempt it carries out the orders ``node_order/<i>/<n>`` in sequence: spawn a worker
  with the argv the coordinator gives (pointed at the coordinator's address as this agent
  was given it, gloo bound to the interface that reaches it: ``core.nodes.gloo_interface``),
  signal one (evict: SIGKILL), dump its stacks (py-spy here, the text posted back), exit;
* once a second it posts its machine's sample and the XID lines of its own kernel log, their
  pids mapped to its workers (``nodes.health``);
* it sleeps on its workers' exits (``ExitWaiter``) and, the moment one ends by a signal or
  left out of a generation, posts the death notice itself (``ftcomm.declare_dead``: the
  survivors drop it in milliseconds, no heartbeat wait, no round trip through the
  coordinator), then ``node_exit/<uid>``;
* its workers die with it: they keep ``PR_SET_PDEATHSIG`` on the agent's fork server
  (``stacked_worker --node``), which ends with the agent, so a killed agent is a lost node,
  as on a real machine; an agent that wakes up fenced (``node_fenced/<i>``: the coordinator
  gave its node up) kills what it started and exits 10, or with ``--rejoin`` asks to come
  back (``node_rejoin/<i>``) and, once the coordinator lifts the fence, takes spares again.

With ``--store etcd://... --job NAME`` (a job run with the same ``--store``) the agent finds
the directory in etcd (``directory``: host, port, epoch) instead of being given its address,
and outlives its coordinator: when the directory goes (the supervisor's process is gone), its
workers pause after one committed step and re-attach to the standby's store
(``runtime.reattach``), and the agent -- the same process, its fork server warm -- waits in
etcd for the directory of the standby that takes the lease over (``coord.follow``,
``--reattach-timeout`` s), claims the same node index there, keeps the workers the standby
adopts (its ``adopt`` order; ``Agent.carried``) and follows the job on. A coordinator host
that vanishes without a reset (the link is cut) still reads as a cut link: exit 10.

The workers fork from a server that is a fork of the agent itself (``spawn.fork_server``): the
agent has imported torch already, so a worker costs a fork, not a second import.

Exit codes: 0 the job ended, 2 bad input (unreachable coordinator or etcd, no directory in
etcd within ``--connect-timeout``, both or neither of ``--coordinator`` and ``--store``, a node
index claimed twice or past the job's nodes, --slots/--spares that do not hold the placement, a
run directory this node does not see), 5 the coordinator went away (with ``--store``: and no
successor came), 10 fenced (the coordinator gave this node up,
or a heartbeat to it blocked for ``CUT_OFF_S`` s: the link is cut).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from datetime import timedelta

from unbroken.core.nodes import CUT_OFF_S, BeatWatch, watch_beat
from unbroken.protocol import (JOB_ATTEMPTS, JOB_NODES, NODE_EXITS, ExitCode, group_of,
                               job_attempt_key, node_error_key, node_exit_key, node_fenced_key,
                               node_hb_key, node_key, node_left_key, node_order_key,
                               node_orders_key, node_pid_key, node_rejoin_key, node_stacks_key)

__all__ = ["main", "AgentError"]

WORKER = "unbroken.runtime.stacked_worker:worker_main"


class AgentError(Exception):
    """Bad input for the agent (exit 2): one line."""


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = str(text).rpartition(":")
    try:
        p = int(port)
    except ValueError:
        p = -1
    if not host or not 0 < p < 65536:
        raise AgentError(f"--coordinator {text!r}: expected HOST:PORT")
    return host, p


def connect(host: str, port: int, timeout: float):
    import torch.distributed as dist

    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)  # c10d logs a failed connect with a C++ stack trace: the line below says it
    try:
        return dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=timeout))
    except Exception as exc:  # torch raises DistNetworkError / RuntimeError / TimeoutError
        why = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise AgentError(f"--coordinator {host}:{port}: cannot be reached within "
                         f"{timeout:g}s ({why})") from None
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def claim(store, node: int | None, record: dict) -> int:
    """Claim ``node`` (or the lowest free index) for this agent in the directory; AgentError
    when it is taken, or when every index of the job is."""
    mine = json.dumps(record)
    total = int(store.get(JOB_NODES)) if store.check([JOB_NODES]) else None
    for i in ([node] if node is not None else range(total or 10_000)):
        got = store.compare_set(node_key(i), "", mine)
        got = got.decode() if isinstance(got, bytes) else got
        if got == mine:
            return i
        if node is not None:
            other = json.loads(got)
            raise AgentError(f"--node {i}: node {i} is claimed already by the agent pid "
                             f"{other.get('pid')} on {other.get('host')}")
    raise AgentError(f"no free node index: the job's {total} nodes are claimed already")


def gloo_ifname(host: str, port: int) -> str | None:
    """The interface this node's workers bind gloo to: ``$GLOO_SOCKET_IFNAME`` when set, else
    the one holding the address the coordinator is reached from (``core.nodes``); None:
    gloo's own choice (by the host name)."""
    import fcntl
    import struct

    from unbroken.core.nodes import gloo_interface

    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))  # no packet: it only asks the kernel for the route
            local = s.getsockname()[0]
    except OSError:
        return None
    addrs = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _i, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                addrs[name] = socket.inet_ntoa(raw[20:24])
            except OSError:  # no IPv4 address there
                pass
    return gloo_interface(addrs, local)[0]


#: every worker this agent process started, in any attempt (killed when it is cut off)
_STARTED: list = []


class _Beat:
    """The agent's heartbeat thread (its own store client): a stopped agent stops beating.

    A cut link is not a closed one: no RST comes, and a store call blocks in the kernel until
    TCP gives up (many minutes; the client's timeout does not bound it, measured). So a
    watchdog thread times the beat in flight (``core.nodes.watch_beat``): blocked for
    ``cut_after`` s (the coordinator fenced this node after its 1 s of silence long before),
    ``on_cut(why)`` runs -- the node stops what it started and leaves (exit 10), instead of
    training on, cut off, for minutes. A call that *fails* (the coordinator's process is
    gone, its host is up: RST) ends the beat and leaves the decision to the attempt's own
    rules (exit 5)."""

    def __init__(self, store, node: int, period: float, on_cut=None,
                 cut_after: float = CUT_OFF_S) -> None:
        self._stop = threading.Event()
        self._calls = 0        # beats begun
        self._busy = False     # a beat is in flight
        st = store.clone()
        st.add(node_hb_key(node), 1)

        def beat() -> None:
            while not self._stop.wait(period):
                self._calls += 1
                self._busy = True
                try:
                    st.add(node_hb_key(node), 1)
                except Exception:
                    return
                finally:
                    self._busy = False

        def watch() -> None:
            state = BeatWatch()
            while not self._stop.wait(period):
                state, why = watch_beat(state, self._calls, self._busy, period, cut_after)
                if why is not None:
                    on_cut(why)
                    return
        threading.Thread(target=beat, name="node-hb", daemon=True).start()
        if on_cut is not None:
            threading.Thread(target=watch, name="node-cut-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def _cut_off(coordinator: str, why: str) -> None:
    """This node cannot reach the coordinator: kill what it started, say so, exit 10."""
    running = [p for p in _STARTED if p.poll() is None]
    for p in running:
        try:
            p.kill()
        except Exception:  # pragma: no cover - gone already
            pass
    sys.stderr.write(f"unbroken: node cut off from the coordinator at {coordinator}: {why} "
                     f"(the link is down or its host is gone); killed the {len(running)} "
                     f"workers it was running, exit {int(ExitCode.FENCED)}\n")
    sys.stderr.flush()
    os._exit(int(ExitCode.FENCED))


def alive(store) -> bool:
    """The store still answers."""
    try:
        store.add(JOB_ATTEMPTS, 0)
        return True
    except Exception:
        return False


class Agent:
    """One node's agent in one attempt of the job; :meth:`run` returns its exit code, or
    None when the attempt ended and the agent follows the job to its next one."""

    TICK_S = 0.02  # orders are read this often; a worker's exit wakes the loop at once
    RETRY_S = 0.25  # the attempt's store failed a call: tried again this much later

    def __init__(self, store, node: int, stderr_dir: str, *, host: str = "127.0.0.1",
                 ifname: str | None = None, directory=None, reporter=None,
                 carried: dict | None = None) -> None:
        from unbroken.procwait import ExitWaiter

        self.st, self.node, self.stderr_dir = store, node, stderr_dir
        # with the job in etcd (``--store``): the workers a lost coordinator left running,
        # paused and re-attaching to its successor's store; its ``adopt`` order says which
        # of them stay. None: a lost coordinator's workers end with it
        self.carried = carried
        self.reporter = reporter  # nodes.health.NodeReporter: the machine's sample, XIDs
        self.host, self.ifname, self.directory = host, ifname, directory
        self.procs: dict[int, object] = {}
        self.fault_dirs: dict[int, str] = {}
        self.reported: set[int] = set()
        self.done_orders = 0
        self.exits = ExitWaiter()
        self._posts: list[tuple[str, str]] = []  # stack dumps done off the loop, to post
        self._posts_lock = threading.Lock()

    def run(self) -> int | None:
        from torch.distributed import DistNetworkError  # imported already (run())

        errors = 0
        while True:
            live = [p for u, p in self.procs.items() if u not in self.reported]
            self.exits.wait(live, self.TICK_S)
            try:
                self._report_exits()
                if self.st.check([node_fenced_key(self.node)]):
                    self._kill_all()
                    # the fence declared every worker ordered here so far dead: a rejoin
                    # (``--rejoin``, this attempt again) must not start the ones a stopped
                    # agent had not started yet, already replaced elsewhere
                    self.done_orders = int(self.st.add(node_orders_key(self.node), 0))
                    return ExitCode.FENCED
                done = self._orders()
                self._post_dumps()
                if self.reporter is not None:
                    running = {p.pid: group_of(u) for u, p in self.procs.items()
                               if p.poll() is None}
                    self.reporter.tick(self.st, running, len(running))
                errors = 0
            except Exception as exc:
                errors += 1
                # closed (its process is gone: a client never reconnects), or 3 s without
                # an answer
                if isinstance(exc, DistNetworkError) or errors >= 3 / self.RETRY_S:
                    return self._store_lost()
                time.sleep(self.RETRY_S)  # each failed call logs a C++ stack: a few, not 150
                continue
            if done:
                return None

    def _report_exits(self) -> None:
        from unbroken.runtime.ftcomm import declare_dead

        for u, p in self.procs.items():
            rc = p.poll()
            if rc is None or u in self.reported:
                continue
            if rc < 0 or rc == ExitCode.JOIN_FAILED:  # the survivors drop it now
                declare_dead(self.st, group_of(u))  # a rank's death is its group's
            self.st.set(node_exit_key(u), str(rc))
            self.st.add(NODE_EXITS, 1)
            self.reported.add(u)

    def _orders(self) -> bool:
        """Carry out the new orders; True once told the attempt is over."""
        count = int(self.st.add(node_orders_key(self.node), 0))
        while self.done_orders < count:
            self.done_orders += 1
            order = json.loads(self.st.get(node_order_key(self.node, self.done_orders)))
            op = order["op"]
            if op == "spawn":
                self._spawn(order["uid"], order["argv"], order.get("stderr"))
            elif op == "signal":
                p = self.procs.get(order["uid"])
                if p is not None:
                    p.send_signal(int(order["sig"]))
            elif op == "dump":
                self._dump(order["uid"], int(order["n"]))
            elif op == "adopt":
                self._adopt(order["uids"])
            elif op == "exit":
                self._kill_all()
                self._report_exits()
                self.st.set(node_left_key(self.node), "1")
                return True
        return False

    def _adopt(self, uids: list) -> None:
        """This attempt's coordinator adopted ``uids`` of the workers carried over from the
        last one: their exits are reported to it from now on; the others are stopped (paused
        at a boundary, they would wait for a go that never comes)."""
        carried = self.carried or {}
        for u in list(carried):
            p = carried.pop(u)
            if u in uids:
                self.procs[u] = p
                self.st.set(node_pid_key(u), str(p.pid))
            else:
                p.kill()
                try:
                    p.wait(timeout=10)
                except Exception:  # pragma: no cover - a worker in D state
                    pass

    def _spawn(self, uid: int | str, argv: list[str], stderr: str | None) -> None:
        from unbroken import spawn

        path = stderr or os.path.join(self.stderr_dir, f"stderr-{uid}")
        env = {"OMP_NUM_THREADS": "1"}
        if self.ifname:
            env["GLOO_SOCKET_IFNAME"] = self.ifname
        # the coordinator's address as this agent reaches it, not the coordinator's own view
        p = spawn.start(WORKER, [*argv, "--node", str(self.node), "--host", self.host],
                        stderr_path=path, env=env)
        self.procs[uid] = p
        _STARTED.append(p)
        if "--journal" in argv:  # where its faulthandler writes (stacked_worker)
            j = argv[argv.index("--journal") + 1]
            self.fault_dirs[uid] = os.path.join(j, "stacks") if os.path.isdir(
                os.path.join(j, "stacks")) else j
        self.st.set(node_pid_key(uid), str(p.pid))

    def _dump(self, uid: int | str, n: int) -> None:
        """Our own worker ``uid``'s stacks (``detect.stacks.dump_stacks``: py-spy, else its
        faulthandler file), off the loop (py-spy pauses the process); the ``Dump``'s fields
        go to ``node_stacks/<uid>/<n>`` from the loop's own store client."""
        from unbroken.detect.stacks import dump_stacks

        p, key = self.procs.get(uid), node_stacks_key(uid, n)

        def dump() -> None:
            if p is None or p.poll() is not None:
                d = {"method": "failed", "text": f"<dump failed: uid {uid} is not running on "
                     f"node {self.node}>", "seconds": 0.0, "error": "not running"}
            else:
                got = dump_stacks(p.pid, fault_dir=self.fault_dirs.get(uid))
                d = {"method": got.method, "text": got.text, "seconds": got.seconds,
                     "error": got.error}
            with self._posts_lock:
                self._posts.append((key, json.dumps(d)))
        threading.Thread(target=dump, name=f"dump-{uid}", daemon=True).start()

    def _post_dumps(self) -> None:
        with self._posts_lock:
            posts, self._posts = self._posts, []
        for key, value in posts:
            self.st.set(key, value)

    def _kill_all(self) -> None:
        procs = [*self.procs.values(), *(self.carried or {}).values()]
        if self.carried:
            self.carried.clear()
        for p in procs:
            p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except Exception:  # pragma: no cover - a worker in D state
                pass

    def _store_lost(self) -> int | None:
        """The attempt's store is gone. With the directory still there the attempt ended
        under us (None: follow the job); otherwise the coordinator is gone: the workers stop
        by themselves (exit 5 with a checkpoint, ``stacked_worker``), wait for them, go --
        or, with the job in etcd, they wait for the standby paused, and go with the agent to
        its next attempt (:attr:`carried`)."""
        if self.directory is not None and alive(self.directory):
            self._kill_all()
            return None
        if self.carried is not None:
            self.carried.update({u: p for u, p in self.procs.items() if u not in self.reported})
            return ExitCode.COORDINATOR_LOST
        deadline = time.monotonic() + 60
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                p.kill()
        return ExitCode.COORDINATOR_LOST


def follow(directory, host: str, node: int, record: dict, stderr_dir: str, *,
           ifname: str | None, connect_timeout: float, rejoin: bool = False,
           xid_log: str | None = None, carried: dict | None = None) -> int:
    """Follow the job's attempts in the directory until it ends: attach to each attempt's
    store, run its orders, leave it. Fenced: exit 10, or with ``rejoin`` ask to come back
    (what it ran is killed already) and, once the coordinator lifts the fence, carry on in
    the attempt it was in (its orders not redone). ``carried``: see ``Agent.carried``.
    Returns the exit code (AgentError: 2)."""
    from unbroken.nodes.health import NodeReporter

    seen, errors, tick = 0, 0, 0.05
    agent, attached = None, 0  # the attempt this agent is in, and its orders done so far
    reporter = NodeReporter(node, xid_log)  # one kernel-log reader for the whole job
    while True:
        try:
            if directory.check([node_fenced_key(node)]):
                if not rejoin:
                    return ExitCode.FENCED
                if not directory.check([node_rejoin_key(node)]):
                    directory.set(node_rejoin_key(node), "1")
                time.sleep(tick)  # until the coordinator lifts the fence (or goes)
                continue
            if directory.check([JOB_NODES]) and node >= (total := int(directory.get(JOB_NODES))):
                directory.delete_key(node_key(node))
                raise AgentError(f"--node {node}: the job has {total} nodes (0..{total - 1})")
            n = int(directory.add(JOB_ATTEMPTS, 0))
            errors = 0
        except AgentError:
            raise
        except Exception:
            errors += 1
            if errors * Agent.RETRY_S >= 3:  # 3 s without the directory: the coordinator
                return ExitCode.COORDINATOR_LOST  # is gone
            time.sleep(Agent.RETRY_S)
            continue
        if agent is not None and n == attached:  # back from a fence, in the same attempt
            code = agent.run()
        elif n <= seen:
            time.sleep(tick)  # between attempts: nothing runs here, a poll costs nothing
            continue
        else:
            seen = n
            rec = json.loads(directory.get(job_attempt_key(n)))
            if rec.get("end"):
                directory.set(node_left_key(node), "1")  # the coordinator may close it now
                if rec.get("error"):
                    raise AgentError(rec["error"])
                return ExitCode.OK
            if rec.get("out") and not os.path.isdir(rec["out"]):
                why = (f"the run directory {rec['out']} is not visible on this node "
                       f"({socket.gethostname()}): --out must be on a filesystem every node "
                       f"mounts at the same path")
                directory.set(node_error_key(node), why)
                raise AgentError(why)
            try:
                st = connect(host, int(rec["port"]), connect_timeout)
            except AgentError:
                continue  # the attempt ended before we got there; the directory says next
            st.set(node_key(node), json.dumps(record))
            reporter.attach(rec.get("out") or stderr_dir)
            agent, attached = Agent(st, node, stderr_dir, host=host, ifname=ifname,
                                    directory=directory, reporter=reporter,
                                    carried=carried), n
            code = agent.run()
        if code == ExitCode.FENCED and rejoin:
            continue  # the directory's fence follows the attempt's: wait there
        if code is not None:
            return code
        agent = None  # the attempt ended


def build_parser(ap: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    ap = ap or argparse.ArgumentParser(prog="unbroken agent", description=__doc__)
    ap.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                    help="the job's directory: `unbroken run --nodes K --listen PORT` on the "
                         "coordinator's host (`--local-nodes K` starts its agents itself)")
    ap.add_argument("--store", default=None, metavar="etcd://HOST:PORT[,...]",
                    help="instead of --coordinator: find the job's directory in etcd (a job "
                         "run with --store etcd://), and when its coordinator is lost, wait "
                         "for the standby that takes over and claim this node in its directory")
    ap.add_argument("--job", default="unbroken", metavar="NAME",
                    help="with --store: the job's name (its keys' prefix /unbroken/NAME/)")
    ap.add_argument("--reattach-timeout", type=float, default=60.0, metavar="S",
                    help="with --store: how long a coordinator's successor is waited for "
                         "(then exit 5)")
    ap.add_argument("--node", type=int, default=None, metavar="I",
                    help="this node's index (default: the lowest free one)")
    ap.add_argument("--slots", type=int, default=None, metavar="K",
                    help="groups this node can host (default: as many as placed here); a "
                         "placement that puts more here stops the job before it starts, exit 2")
    ap.add_argument("--spares", type=int, default=None, metavar="K",
                    help="warm spares and replacements this node can host besides its groups "
                         "(default: no limit)")
    ap.add_argument("--rejoin", action="store_true",
                    help="fenced (cut off, given up by the coordinator): kill what it ran and "
                         "offer this node again as spare capacity once it beats again, "
                         "instead of exit 10")
    ap.add_argument("--xid-log", default=None, metavar="FILE",
                    help="this node's kernel log (dmesg saved to a file, kern.log): its XID "
                         "lines go to the coordinator's guard, their pids mapped to this "
                         "node's workers")
    ap.add_argument("--heartbeat", type=float, default=0.1, metavar="S",
                    help="the agent's heartbeat period (the coordinator judges its silence)")
    ap.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                    help="give up (exit 2) when the coordinator cannot be reached this long")
    ap.add_argument("--stderr-dir", default=None,
                    help="where the workers' stderr goes (default: a temporary directory)")
    return ap


def run(a: argparse.Namespace) -> int:
    """The agent from parsed flags: its exit code (AgentError: bad input, exit 2)."""
    import tempfile

    from unbroken import spawn

    if (a.coordinator is None) == (a.store is None):
        raise AgentError("give one of --coordinator HOST:PORT and --store etcd://HOST:PORT "
                         "(where the job's directory is found)")
    locate = _fixed(a.coordinator) if a.coordinator is not None else _in_etcd(a)
    if a.node is not None and a.node < 0:
        raise AgentError(f"--node {a.node}: must be >= 0")
    for flag, v in (("--slots", a.slots), ("--spares", a.spares)):
        if v is not None and v < 0:
            raise AgentError(f"{flag} {v}: must be >= 0")
    import torch.distributed  # noqa: F401 - before the fork server: its workers inherit it

    # an agent is started by hand or by a node's init system, not by unbroken: its own store
    # connects (at a takeover too) must not wait out the resolver's default 5 s on a dropped
    # reverse lookup (spawn.RESOLVER_OPTIONS)
    spawn.quick_resolver()
    spawn.fork_server()  # no thread yet: this process is still safe to fork
    record = {"pid": os.getpid(), "host": socket.gethostname(), "slots": a.slots,
              "spares": a.spares}
    stderr_dir = a.stderr_dir or tempfile.mkdtemp(prefix="unbroken-node-")
    node, epoch = a.node, None
    carried: dict | None = {} if a.store is not None else None  # see Agent.carried
    while True:
        host, port, epoch = locate(epoch)
        directory = connect(host, port, a.connect_timeout)
        node = claim(directory, node, record)  # after a takeover: the same index again
        beat = _Beat(directory, node, a.heartbeat,
                     on_cut=lambda why, at=f"{host}:{port}": _cut_off(at, why))
        try:
            code = follow(directory, host, node, record, stderr_dir,
                          ifname=gloo_ifname(host, port), connect_timeout=a.connect_timeout,
                          rejoin=a.rejoin, xid_log=a.xid_log, carried=carried)
        finally:
            beat.stop()
        if code != ExitCode.COORDINATOR_LOST or a.store is None:
            return code
        sys.stderr.write(f"unbroken: agent {node}: the coordinator at {host}:{port} is lost; "
                         f"waiting up to {a.reattach_timeout:g}s for the one that takes over\n")


def _fixed(coordinator: str):
    """``--coordinator``: one directory for the agent's whole life."""
    host, port = parse_address(coordinator)
    return lambda _epoch: (host, port, None)


def _in_etcd(a: argparse.Namespace):
    """``--store``: the directory named in etcd (``directory``: host, port, epoch); checked
    now (a wrong scheme, an etcd that does not answer: AgentError). The first is waited for
    ``--connect-timeout`` s, the successor of a lost one ``--reattach-timeout`` s (then the
    agent gives up: exit 5, as without etcd)."""
    from unbroken.coord.etcd import Etcd, EtcdError
    from unbroken.coord.follow import wait_new_epoch
    from unbroken.core.coordination import check_job_name, job_prefix, parse_store

    try:
        store, job = parse_store(a.store), check_job_name(a.job)
    except ValueError as e:
        raise AgentError(str(e)) from None
    if store.kind != "etcd":
        raise AgentError(f"--store {a.store!r}: expected etcd://HOST:PORT[,HOST:PORT...]")
    etcd = Etcd(list(store.endpoints), timeout=1.0)
    try:
        etcd.status()
    except EtcdError as e:
        raise AgentError(f"--store {a.store}: {e}") from None
    key = job_prefix(job) + "directory"

    def locate(epoch: str | None) -> tuple[str, int, str]:
        rec = wait_new_epoch(etcd, key, epoch,
                             a.connect_timeout if epoch is None else a.reattach_timeout)
        if rec is None and epoch is None:
            raise AgentError(f"--store {a.store} --job {job}: no node directory in etcd "
                             f"within {a.connect_timeout:g}s (is the job running with "
                             f"--nodes and this --store?)")
        if rec is None:
            sys.stderr.write(f"unbroken: no coordinator took job {job} over within "
                             f"{a.reattach_timeout:g}s, exit {int(ExitCode.COORDINATOR_LOST)}\n")
            sys.stderr.flush()
            os._exit(int(ExitCode.COORDINATOR_LOST))
        return str(rec["host"]), int(rec["port"]), str(rec["epoch"])
    return locate


def main(argv: list[str] | None = None) -> None:
    """Entry point for ``unbroken.spawn`` (local nodes) and ``python -m``."""
    a = build_parser().parse_args(argv)
    try:
        code = run(a)
    except AgentError as e:
        sys.stderr.write(f"unbroken: error: {e}\n")
        code = ExitCode.USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


if __name__ == "__main__":
    main()
