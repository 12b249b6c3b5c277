"""Stack dumps for the stall vote taken by a node's own agent (py-spy there: the coordinator
cannot ptrace a process on another machine): ``NodeCluster.dump_stacks`` posts a dump order,
the agent dumps its worker off its loop and posts the text back through the store."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.mp


@pytest.mark.timeout(60)
def test_the_agent_dumps_its_own_worker_on_order_and_the_coordinator_gets_the_text(tmp_path):
    import torch.distributed as dist

    from unbroken.detect.stacks import pyspy_path
    from unbroken.nodes.agent import Agent
    from unbroken.nodes.cluster import NodeCluster

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    worker = subprocess.Popen([sys.executable, "-c",
                               "import time\ndef stuck_in_allreduce():\n    time.sleep(120)\n"
                               "stuck_in_allreduce()"])
    agent = Agent(store.clone(), 0, str(tmp_path))
    agent.procs[7] = worker  # as if it had spawned it
    ran = threading.Thread(target=agent.run, daemon=True)
    ran.start()
    # the coordinator's side, without the workers a whole NodeCluster would start
    c = NodeCluster.__new__(NodeCluster)
    c.store, c._order_lock, c._orders = store, threading.Lock(), {}
    c.cfg = SimpleNamespace(ranks_per_group=1)
    c.node_of, c.lost, c.procs = {7: 0, 8: 0}, {}, {7: worker, 8: SimpleNamespace(pid=-1)}
    try:
        d = c.dump_stacks(7)
        if pyspy_path() is not None:
            assert d.method == "py-spy", d.error
        assert "stuck_in_allreduce" in d.text and d.pid == worker.pid
        gone = c.dump_stacks(8)  # not running on that node: a failed dump, named
        assert gone.method == "failed" and "uid 8 is not running on node 0" in gone.text
        c.order(0, {"op": "exit"})
        ran.join(timeout=20)
        assert not ran.is_alive() and worker.poll() is not None  # the attempt's end kills it
    finally:
        worker.kill()
        worker.wait()

