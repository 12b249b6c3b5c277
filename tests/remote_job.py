"""A job as several machines run it, for the node tests: the supervisor on a thread of the test
process (``unbroken run --nodes K --listen PORT``), each agent a process tree of its own
(``unbroken agent --coordinator ADDR:PORT``), optionally inside another network namespace
(:func:`netns`: its own interfaces, address and routes, joined to this one by a veth pair:
the closest this one box comes to a second machine).

Import as ``from remote_job import ...`` (``pythonpath = ["tests"]``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Callable, Sequence

import pytest
import torch
import torch.distributed as dist

from unbroken.protocol import JOB_ATTEMPTS, job_attempt_key
from unbroken.runtime.trainer import reference_run
from unbroken.supervise import JobSpec, Supervisor
from unbroken.supervise.spec import check, train_config


def host_address() -> str:
    """This host's address on its default route (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.254", 9))
            addr = s.getsockname()[0]
    except OSError:
        addr = "127.0.0.1"
    if addr.startswith("127."):
        pytest.skip("no non-loopback IPv4 address on this host")
    return addr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def netns(tag: int):
    """A :class:`unbroken.testing.netns.NetNs` (the test skips where there is none)."""
    from unbroken.testing.netns import NetNs, NetNsUnavailable

    try:
        return NetNs(tag)
    except NetNsUnavailable as e:
        pytest.skip(str(e))


class RemoteJob:
    """The supervisor on a thread of this process, K agents as processes of their own.

    ``addr``: the coordinator's address as the agents are told it (default: this host's);
    ``prefixes``: per agent, what its command line starts with (``NetNs.prefix()`` runs it in
    another network namespace); ``agent_args``: flags for every agent, or a function of the
    node index."""

    def __init__(self, tmp_path, nodes: int, agent_args: Sequence[str] | Callable = (),
                 addr: str | None = None, prefixes: Sequence[Sequence[str]] | None = None,
                 **spec) -> None:
        self.addr, port = addr or host_address(), free_port()
        self.port = port
        self.spec = JobSpec(trainer="mlp", nodes=nodes, listen=port, out=str(tmp_path / "run"),
                            timeout=240, **spec)
        self.sup = Supervisor(self.spec)
        self.result = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        prefixes = prefixes or [[] for _ in range(nodes)]
        self.agents = [subprocess.Popen(
            [*prefixes[k], sys.executable, "-m", "unbroken", "agent", "--coordinator",
             f"{self.addr}:{port}", "--node", str(k), "--connect-timeout", "120",
             *(agent_args(k) if callable(agent_args) else agent_args)],
            stderr=open(tmp_path / f"agent-{k}.err", "w"), start_new_session=True)
            for k in range(nodes)]

    def _run(self) -> None:
        self.result = self.sup.run()

    def wait_for(self, pred, timeout: float = 180) -> None:
        """Until an event the supervisor journaled satisfies ``pred``."""
        deadline, seen = time.monotonic() + timeout, 0
        while True:
            events = list(self.sup.events)
            if any(pred(e) for e in events[seen:]):
                return
            seen = len(events)
            assert self.thread.is_alive(), (
                f"the supervisor ended first: {self.result and self.result.message!r}; "
                f"last events: {events[-8:]}")
            assert time.monotonic() < deadline, f"nothing matched within {timeout}s"
            time.sleep(0.02)  # polling the supervisor's own list: it has no wake-up to give

    def attempt_store(self):
        """A client of the running attempt's store (its port is in the directory)."""
        d = dist.TCPStore(self.addr, self.port, is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
        rec = json.loads(d.get(job_attempt_key(int(d.add(JOB_ATTEMPTS, 0)))))
        return dist.TCPStore(self.addr, rec["port"], is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=30))

    def finish(self, agents: Sequence[int] | None = None) -> list[int]:
        """Wait for the supervisor, then for the agents ``agents`` (default all): exit codes."""
        self.thread.join(timeout=200)
        assert not self.thread.is_alive()
        which = range(len(self.agents)) if agents is None else agents
        return [self.agents[k].wait(timeout=30) for k in which]

    def close(self) -> None:
        for a in self.agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait()


def check_exact(job: RemoteJob) -> None:
    """The run ended well, every sample exactly once, parameters equal the failure-free run."""
    res, spec = job.result, job.spec
    assert res.ok, res.message
    assert res.report["steps"] == spec.steps and res.report["exactly_once"] is True, \
        {k: res.report.get(k) for k in ("steps", "ledger", "ledger_error", "orphan_commits")}
    ref = reference_run(train_config(spec, spec.sdc_interval(check(spec))))
    diff = max((torch.tensor(p, dtype=torch.float64) - ref).abs().max().item()
               for p in res.params.values())
    assert diff < 1e-5
