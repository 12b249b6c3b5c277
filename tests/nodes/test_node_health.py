"""A node's own health: its agent samples the machine and reads its own kernel log
(``nodes.health``); the coordinator's guard answers (``guard.on_node_xid``,
``on_node_health``). The reporter runs against a real store here; the last test runs the whole
path with two agents."""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from unbroken.nodes.health import NodeReporter, sample_node  # noqa: E402
from unbroken.protocol import node_health_key, node_xid_key, node_xids_key  # noqa: E402

LINE = "[{t:12.6f}] NVRM: Xid (PCI:0000:3b:00): {code}, pid={pid}, name=python, text\n"


def _store():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))


def test_sample_node_reads_this_machine(tmp_path):
    s = sample_node(str(tmp_path))
    assert 0 < s["mem_avail_mb"] <= s["mem_total_mb"]
    assert s["disk_free_mb"] > 0 and s["cpus"] == os.cpu_count() and s["load1"] >= 0
    assert "disk_free_mb" not in sample_node(str(tmp_path / "missing"))  # left out, no raise


def test_reporter_skips_the_logs_history_and_maps_new_xids_to_its_workers(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(LINE.format(t=1.0, code=79, pid=111))  # before the agent: history
    rep = NodeReporter(3, str(log))
    rep.attach(str(tmp_path))
    st = _store()
    with open(log, "a") as f:
        f.write(LINE.format(t=2.0, code=48, pid=4242) + LINE.format(t=3.0, code=31, pid=999))
    rep.tick(st, {4242: 7}, workers=1)
    assert int(st.add(node_xids_key(3), 0)) == 2
    first, second = (json.loads(st.get(node_xid_key(3, i))) for i in (1, 2))
    assert (first["uid"], first["code"], first["pid"]) == (7, 48, 4242)
    assert second["uid"] is None and second["code"] == 31  # not one of this node's workers
    sample = json.loads(st.get(node_health_key(3)))
    assert sample["workers"] == 1 and sample["disk_free_mb"] > 0
    rep.tick(st, {4242: 7}, workers=1)  # not due yet: nothing new posted
    assert int(st.add(node_xids_key(3), 0)) == 2
    rep.attach(str(tmp_path))  # the next attempt: a new store, records from 1, nothing again
    st2 = _store()
    rep.tick(st2, {}, workers=0)
    assert not st2.check([node_xids_key(3)]) or int(st2.add(node_xids_key(3), 0)) == 0


@pytest.mark.mp
@pytest.mark.timeout(300)
def test_an_xid_in_a_nodes_own_kernel_log_evicts_its_worker(tmp_path):
    """Two agents; node 1 reads its own kernel log. An XID 79 (fallen off the bus: the GPU is
    gone) is written there with the pid of a worker node 1 runs: the guard (act) evicts that
    group, a spare takes its slot, the run ends exactly once. Both nodes' samples are
    journaled."""
    from remote_job import RemoteJob, check_exact

    from unbroken.core.nodes import place_groups
    from unbroken.events import Event
    from unbroken.protocol import node_pid_key
    from unbroken.supervise.spec import FTConfig

    log = tmp_path / "node1-kern.log"
    log.write_text("")
    job = RemoteJob(tmp_path, 2, agent_args=lambda k: ["--xid-log", str(log)] if k == 1 else [],
                    groups=4, steps=1000, ft=FTConfig(spares=1, guard="act"))
    try:
        job.wait_for(lambda e: e["event"] == Event.COMMIT and e["step"] >= 4)
        victim = place_groups(4, 2, 2)[0].index(1)  # node 1's first group (its uid)
        pid = int(job.attempt_store().get(node_pid_key(victim)))
        with open(log, "a") as f:
            f.write(LINE.format(t=5.0, code=79, pid=pid))
        # the MLP's steps take a millisecond: the run must still be on when the line is read
        # (failed once in a loaded suite run, cause not captured; this says it if it recurs)
        job.wait_for(lambda e: e["event"] == Event.NODE_XID)
        job.finish()
    finally:
        job.close()
    events = job.sup.events
    xid = [e for e in events if e["event"] == Event.NODE_XID]
    assert [(e["node"], e["uid"], e["code"]) for e in xid] == [(1, victim, 79)]
    alert = next(e for e in events if e["event"] == Event.ALERT and e.get("how") == "xid")
    assert alert["group"] == victim and alert["node"] == 1
    assert any(e["event"] == Event.DETECTED and e["group"] == victim and e["how"] == "xid"
               for e in events)
    assert {e["node"] for e in events if e["event"] == Event.NODE_HEALTH} == {0, 1}
    check_exact(job)
