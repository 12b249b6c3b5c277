"""The job's node directory: the one store node agents are given, alive for the whole job.

Why a directory beside each attempt's store: a wipe-out restart starts a new attempt with a
new store (its keys start clean: generations, heartbeats, join records), and an agent on
another machine cannot be restarted by the coordinator. So the agents connect to this store
once (``unbroken agent --coordinator HOST:PORT``): they claim their node here, beat here,
and follow the attempts posted here (``job/attempts``, ``job/attempt/<n>``: the attempt's
store port), attaching to each attempt's store on the same host. A node lost in one attempt
stays fenced here, so the next attempt places the groups on the nodes still live.

It listens on every interface at ``port`` (``unbroken run --nodes K --listen PORT``; any free
port for ``--local-nodes K``, whose agents it starts itself, each a process tree of its own).
It dies with the coordinator (``store_host``), so agents find the coordinator's death as the
directory's loss (exit 5).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from datetime import timedelta

from unbroken.protocol import (JOB_ATTEMPTS, JOB_NODES, job_attempt_key, node_error_key,
                               node_fenced_key, node_hb_key, node_key, node_left_key,
                               node_rejoin_key)

__all__ = ["NodeDirectory", "NodeSetupError", "NodeStartError"]


class NodeSetupError(ValueError):
    """The agents cannot run this job (their room, a node that cannot see the run
    directory): one line, exit 2 like any bad input."""


class NodeStartError(RuntimeError):
    """The agents did not come (none claimed a node in time, one exited first), or the
    directory did not start: the run cannot start, exit 1 (the supervisor's RunError)."""


class NodeDirectory:
    """``nodes`` nodes; ``local``: start their agents here (``--local-nodes``), with
    ``slots[k]`` groups each; otherwise agents elsewhere claim them (``--nodes``)."""

    TICK_S = 0.02
    CLAIM_TIMEOUT_S = 120.0  # agents started by hand on K machines: give people time

    def __init__(self, nodes: int, *, port: int = 0, local: bool = False,
                 slots: list[int] | None = None, heartbeat: float = 0.1,
                 claim_timeout: float | None = None) -> None:
        import torch.distributed as dist

        from unbroken import spawn

        self.count, self.local, self.heartbeat = nodes, local, heartbeat
        self.claim_timeout = self.CLAIM_TIMEOUT_S if claim_timeout is None else claim_timeout
        self.errdir = tempfile.mkdtemp(prefix="unbroken-nodes-")
        self.agents: dict[int, object] = {}  # local agents: node -> process
        self.fenced: dict[int, str] = {}     # node -> why (this coordinator's own record)
        self._lock = threading.Lock()        # one client, used by the attempt's watcher too
        self._claims: dict[int, dict] | None = None
        self._ended = False
        self.host_proc = spawn.start("unbroken.runtime.store_host:main", [str(port)],
                                     stderr_path=os.path.join(self.errdir, "directory"),
                                     channel=True)
        try:
            self.port = int(self.host_proc.receive(timeout=120))
        except (TimeoutError, EOFError):
            raise NodeStartError(f"the node directory did not start on port {port}: "
                               f"{self._stderr('directory')[-300:]}") from None
        self.store = dist.TCPStore("127.0.0.1", self.port, is_master=False,
                                   wait_for_workers=False, timeout=timedelta(seconds=30))
        self.store.set(JOB_NODES, str(nodes))
        if local:
            for k in range(nodes):
                self.agents[k] = spawn.start(
                    "unbroken.nodes.agent:main",
                    ["--coordinator", f"127.0.0.1:{self.port}", "--node", str(k),
                     *(["--slots", str(slots[k])] if slots else []),
                     "--heartbeat", str(heartbeat), "--stderr-dir", self.errdir],
                    stderr_path=os.path.join(self.errdir, f"agent-{k}"))

    def _stderr(self, name: str) -> str:
        try:
            with open(os.path.join(self.errdir, name), "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr(self, node: int) -> str:
        return self._stderr(f"agent-{node}")

    # ------------------------------------------------------------------ claims
    def claims(self) -> dict[int, dict]:
        """Every node's claim (``{"pid", "host", "slots", "spares"}``), once all are in;
        RuntimeError when an agent gave up first or none came within ``claim_timeout``."""
        if self._claims is not None:
            return self._claims
        self.await_nodes(lambda k: self._check(node_key(k)), range(self.count), "claimed it",
                         hint=f" (unbroken agent --coordinator HOST:{self.port} --node K)")
        with self._lock:
            self._claims = {k: json.loads(self.store.get(node_key(k)))
                            for k in range(self.count)}
        return self._claims

    def await_nodes(self, done, nodes, what: str, *, strict: bool = True,
                    timeout: float | None = None, hint: str = "") -> None:
        """Until ``done(k)`` for every node ``k`` in ``nodes``. ``strict``: RuntimeError (or
        the agent's own NodeSetupError) when an agent gave up or ``timeout`` (default
        ``claim_timeout``) passed first; otherwise stop waiting for that node then."""
        from unbroken.procwait import ExitWaiter

        exits = ExitWaiter()
        deadline = time.monotonic() + (self.claim_timeout if timeout is None else timeout)
        for k in nodes:
            while not done(k):
                a = self.agents.get(k)
                gone = a is not None and a.poll() is not None
                late = time.monotonic() > deadline
                if not strict and (gone or late):
                    break
                self.agent_error(k)
                if gone:
                    raise NodeStartError(f"node agent {k} exited with code {a.returncode} before "
                                       f"it {what}: {self.stderr(k)[-500:]}")
                if late:
                    raise NodeStartError(f"node {k}: no agent {what} within "
                                       f"{self.claim_timeout:g}s{hint}")
                if a is not None:
                    exits.wait([a], self.TICK_S)  # a local agent: its exit wakes us
                else:
                    time.sleep(self.TICK_S)  # an agent elsewhere: nothing here to sleep on

    def agent_error(self, node: int) -> None:
        """Raise an agent's own refusal (``node_error/<i>``) as NodeSetupError."""
        if self._check(node_error_key(node)):
            with self._lock:
                why = self.store.get(node_error_key(node)).decode()
            raise NodeSetupError(f"node {node}: {why}")

    def _check(self, key: str) -> bool:
        with self._lock:
            return bool(self.store.check([key]))

    # ------------------------------------------------------------------ attempts
    def live(self) -> list[int]:
        """Nodes not fenced (their agents follow the job)."""
        return [k for k in range(self.count) if k not in self.fenced]

    def fence_silent(self, window: float) -> dict[int, str]:
        """Between attempts nobody watches the agents' heartbeats: before a restart, fence
        the live nodes whose counter did not move within ``window`` s (an agent that died
        during the backoff), so the next attempt is placed on the others. Returns them, and
        why. Costs about one heartbeat period when every agent beats."""
        nodes = self.live()
        with self._lock:
            first = {k: int(self.store.add(node_hb_key(k), 0)) for k in nodes}
        deadline, moving = time.monotonic() + window, set()
        while len(moving) < len(nodes) and time.monotonic() < deadline:
            time.sleep(self.TICK_S)
            with self._lock:
                moving |= {k for k in nodes if k not in moving
                           and int(self.store.add(node_hb_key(k), 0)) != first[k]}
        silent = {k: f"its heartbeat did not move for {window:g}s before a restart"
                  for k in nodes if k not in moving}
        for k, why in silent.items():
            self.fence(k, why)
        return silent

    def publish(self, port: int, out: str) -> int:
        """Post a new attempt (its store's port, the run directory): the agents attach."""
        with self._lock:
            n = int(self.store.add(JOB_ATTEMPTS, 0)) + 1
            self.store.set(job_attempt_key(n), json.dumps({"port": port, "out": out}))
            self.store.add(JOB_ATTEMPTS, 1)
        return n

    def fence(self, node: int, why: str) -> None:
        """Node ``node`` is lost for the rest of the job: its agent, woken, exits 10."""
        with self._lock:
            self.fenced[node] = why
            self.store.set(node_fenced_key(node), why)

    def rejoin(self, node: int) -> None:
        """Lift node ``node``'s fence: its agent (``--rejoin``), waiting for this, attaches
        again to the running attempt."""
        with self._lock:
            self.fenced.pop(node, None)
            self.store.delete_key(node_rejoin_key(node))
            self.store.delete_key(node_fenced_key(node))

    def end(self, error: str | None = None) -> None:
        """The job is over (agents exit 0), or cannot run on these nodes (``error``: the
        agents print it and exit 2)."""
        if self._ended:
            return
        self._ended = True
        try:
            with self._lock:
                n = int(self.store.add(JOB_ATTEMPTS, 0)) + 1
                self.store.set(job_attempt_key(n), json.dumps(
                    {"end": True, **({"error": error} if error else {})}))
                self.store.add(JOB_ATTEMPTS, 1)
        except Exception:  # the directory is gone already: the agents see that (exit 5)
            pass

    # ------------------------------------------------------------------ fault injection
    def kill_node(self, node: int) -> None:
        """SIGKILL local agent ``node`` with its process group (its fork server); its
        workers follow by ``PR_SET_PDEATHSIG``."""
        try:
            os.killpg(self.agents[node].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cut_node(self, node: int) -> None:
        """SIGSTOP local agent ``node`` only: its workers run on, only its silence tells."""
        self.agents[node].send_signal(signal.SIGSTOP)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        self.end()
        deadline = time.monotonic() + 10
        for k in self.live():  # agents elsewhere: each says it read the end before it goes
            if k not in self.agents and self._claims is not None:
                try:
                    while time.monotonic() < deadline and not self._check(node_left_key(k)):
                        time.sleep(self.TICK_S)
                except Exception:  # the directory's host is gone already
                    break
        for k, a in self.agents.items():
            try:
                a.wait(timeout=max(0.0, deadline - time.monotonic()) if k not in self.fenced
                       else 0)
            except subprocess.TimeoutExpired:
                pass
            if a.poll() is None:  # a cut-off (stopped) agent: it goes with its group
                try:
                    os.killpg(a.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                a.wait(timeout=10)
        if self.host_proc.poll() is None:
            self.host_proc.kill()
            self.host_proc.wait(timeout=10)
