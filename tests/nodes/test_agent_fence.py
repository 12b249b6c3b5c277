"""A fenced agent that rejoins (``--rejoin``) carries on in the attempt it was in, but not with
the orders posted before its fence: the coordinator declared every worker ordered there dead
when it fenced the node, and replaced them elsewhere. Found in a loaded run: an agent
SIGSTOPped before it had started its two workers started them after its rejoin, 4 s late,
beside the spares that had replaced them. A real TCPStore and the real order loop
(``Agent.run``); the started process is a plain sleeper, not a worker."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.mp

import torch.distributed as dist  # noqa: E402

from unbroken.nodes.agent import Agent  # noqa: E402
from unbroken.protocol import ExitCode, node_fenced_key, node_order_key, node_orders_key  # noqa: E402


def _order(st, node: int, n: int, order: dict) -> None:
    st.set(node_order_key(node, n), json.dumps(order))  # as NodeCluster.order posts them
    st.add(node_orders_key(node), 1)


@pytest.mark.timeout(60)
def test_orders_posted_before_a_fence_are_not_carried_out_after_the_rejoin(monkeypatch, tmp_path):
    started: list = []

    def start(entry, argv, **kw):
        started.append(argv[argv.index("--uid") + 1])
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    monkeypatch.setattr("unbroken.spawn.start", start)
    st = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                       timeout=timedelta(seconds=10))
    node = 1
    # the attempt's first orders reach an agent that is stopped; the coordinator fences it
    for n, uid in ((1, 1), (2, 4)):
        _order(st, node, n, {"op": "spawn", "uid": uid, "argv": ["--uid", str(uid)]})
    st.set(node_fenced_key(node), "its heartbeat was silent for 1.01s")
    agent = Agent(st, node, str(tmp_path))
    assert agent.run() == ExitCode.FENCED
    assert started == []
    # the fence lifted: a spare is ordered there, then the attempt ends
    st.delete_key(node_fenced_key(node))
    _order(st, node, 3, {"op": "spawn", "uid": 7, "argv": ["--uid", "7"]})
    _order(st, node, 4, {"op": "exit"})
    assert agent.run() is None
    assert started == ["7"]  # not 1 and 4: they were declared dead with the fence
    assert all(p.poll() is not None for p in agent.procs.values())  # the exit order reaped
