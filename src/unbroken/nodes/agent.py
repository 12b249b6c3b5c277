"""The node agent: ``unbroken agent --coordinator HOST:PORT [--node I] [--slots K] [--spares K]``.

Why an agent: across machines the supervisor can neither fork a worker nor ``waitpid`` one, so
each machine runs one agent that does both for it and talks to the coordinator through the
store the coordinator already hosts (no second protocol, no second port):

* it claims ``node/<i>`` with ``compare_set`` (a second agent for the same index: one line,
  exit 2) and beats ``node_hb/<i>`` from a thread of its own, so a stopped (cut-off) agent
  stops beating and the coordinator declares the node lost (``core.nodes.stale_nodes``);
* it carries out the orders ``node_order/<i>/<n>`` in sequence: spawn a worker with the argv
  the coordinator gives, signal one (evict: SIGKILL; dump stacks: SIGUSR1, the workers'
  faulthandler), exit;
* it sleeps on its workers' exits (``ExitWaiter``) and, the moment one ends by a signal or
  left out of a generation, posts the death notice itself (``ftcomm.declare_dead``: the
  survivors drop it in milliseconds, no heartbeat wait, no round trip through the
  coordinator), then ``node_exit/<uid>``;
* its workers die with it: they keep ``PR_SET_PDEATHSIG`` on the agent's fork server
  (``stacked_worker --node``), which ends with the agent, so a killed agent is a lost node,
  as on a real machine; an agent that wakes up fenced (``node_fenced/<i>``: the coordinator
  gave its node up) kills what it started and exits 10.

The workers fork from a server that is a fork of the agent itself (``spawn.fork_server``): the
agent has imported torch already, so a worker costs a fork, not a second import.

Exit codes: 0 told to exit, 2 bad input (unreachable coordinator, a node index claimed twice),
5 the coordinator's store went away, 10 fenced.
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

from unbroken.protocol import (NODE_EXITS, ExitCode, node_exit_key,
                               node_fenced_key, node_hb_key, node_key, node_order_key,
                               node_orders_key, node_pid_key)

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
    """Claim ``node`` (or the lowest free index) for this agent; AgentError when it is taken."""
    mine = json.dumps(record)
    for i in ([node] if node is not None else range(10_000)):
        got = store.compare_set(node_key(i), "", mine)
        got = got.decode() if isinstance(got, bytes) else got
        if got == mine:
            return i
        if node is not None:
            other = json.loads(got)
            raise AgentError(f"--node {i}: node {i} is claimed already by the agent pid "
                             f"{other.get('pid')} on {other.get('host')}")
    raise AgentError("no free node index")  # pragma: no cover


class _Beat:
    """The agent's heartbeat thread (its own store client): a stopped agent stops beating."""

    def __init__(self, store, node: int, period: float) -> None:
        self._stop = threading.Event()
        st = store.clone()
        st.add(node_hb_key(node), 1)

        def beat() -> None:
            while not self._stop.wait(period):
                try:
                    st.add(node_hb_key(node), 1)
                except Exception:
                    return
        threading.Thread(target=beat, name="node-hb", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


class Agent:
    """One node's agent; :meth:`run` returns its exit code."""

    TICK_S = 0.02  # orders are read this often; a worker's exit wakes the loop at once

    def __init__(self, store, node: int, stderr_dir: str) -> None:
        from unbroken.procwait import ExitWaiter

        self.st, self.node, self.stderr_dir = store, node, stderr_dir
        self.procs: dict[int, object] = {}
        self.reported: set[int] = set()
        self.done_orders = 0
        self.exits = ExitWaiter()

    def run(self) -> int:
        errors = 0
        while True:
            live = [p for u, p in self.procs.items() if u not in self.reported]
            self.exits.wait(live, self.TICK_S)
            try:
                self._report_exits()
                if self.st.check([node_fenced_key(self.node)]):
                    self._kill_all()
                    return ExitCode.FENCED
                code = self._orders()
                errors = 0
            except Exception:
                errors += 1
                if errors >= 3 / self.TICK_S:  # 3 s without the coordinator's store
                    return self._orphaned()
                continue
            if code is not None:
                return code

    def _report_exits(self) -> None:
        from unbroken.runtime.ftcomm import declare_dead

        for u, p in self.procs.items():
            rc = p.poll()
            if rc is None or u in self.reported:
                continue
            if rc < 0 or rc == ExitCode.JOIN_FAILED:  # the survivors drop it now
                declare_dead(self.st, u)
            self.st.set(node_exit_key(u), str(rc))
            self.st.add(NODE_EXITS, 1)
            self.reported.add(u)

    def _orders(self) -> int | None:
        count = int(self.st.add(node_orders_key(self.node), 0))
        while self.done_orders < count:
            self.done_orders += 1
            order = json.loads(self.st.get(node_order_key(self.node, self.done_orders)))
            op = order["op"]
            if op == "spawn":
                self._spawn(int(order["uid"]), order["argv"], order.get("stderr"))
            elif op == "signal":
                p = self.procs.get(int(order["uid"]))
                if p is not None:
                    p.send_signal(int(order["sig"]))
            elif op == "exit":
                self._kill_all()
                return ExitCode.OK
        return None

    def _spawn(self, uid: int, argv: list[str], stderr: str | None) -> None:
        from unbroken import spawn

        path = stderr or os.path.join(self.stderr_dir, f"stderr-{uid}")
        p = spawn.start(WORKER, [*argv, "--node", str(self.node)], stderr_path=path,
                        env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
        self.procs[uid] = p
        self.st.set(node_pid_key(uid), str(p.pid))

    def _kill_all(self) -> None:
        for p in self.procs.values():
            p.kill()
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except Exception:  # pragma: no cover - a worker in D state
                pass

    def _orphaned(self) -> int:
        """The coordinator's store is gone: the workers stop by themselves (exit 5 with a
        checkpoint, ``stacked_worker``); wait for them, then go."""
        deadline = time.monotonic() + 60
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                p.kill()
        return ExitCode.COORDINATOR_LOST


def build_parser(ap: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    ap = ap or argparse.ArgumentParser(prog="unbroken agent", description=__doc__)
    ap.add_argument("--coordinator", required=True, metavar="HOST:PORT",
                    help="the coordinator's store (`unbroken run --local-nodes K` starts its "
                         "agents itself with its address)")
    ap.add_argument("--node", type=int, default=None, metavar="I",
                    help="this node's index (default: the lowest free one)")
    ap.add_argument("--slots", type=int, default=1, metavar="K",
                    help="groups this node can host")
    ap.add_argument("--spares", type=int, default=1, metavar="K",
                    help="warm spares this node can host")
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

    host, port = parse_address(a.coordinator)
    if a.node is not None and a.node < 0:
        raise AgentError(f"--node {a.node}: must be >= 0")
    if a.slots < 0 or a.spares < 0:
        raise AgentError(f"--slots {a.slots} / --spares {a.spares}: must be >= 0")
    import torch.distributed  # noqa: F401 - before the fork server: its workers inherit it

    spawn.fork_server()  # no thread yet: this process is still safe to fork
    store = connect(host, port, a.connect_timeout)
    node = claim(store, a.node, {"pid": os.getpid(), "host": socket.gethostname(),
                                 "slots": a.slots, "spares": a.spares})
    beat = _Beat(store, node, a.heartbeat)
    try:
        return Agent(store, node, a.stderr_dir or tempfile.mkdtemp(prefix="unbroken-node-")).run()
    finally:
        beat.stop()


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
