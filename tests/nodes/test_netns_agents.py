"""A node on a network stack of its own: agent 1 runs in another network namespace (its own
interfaces, address and routes; a veth pair its only link), so its workers' gloo pairs and
store connections cross a real link between two addresses, as they would between machines.
Then the link goes down: the node is *cut off* -- every process on it keeps running, nothing
dies, no connection is reset; packets are simply dropped. The coordinator finds it by its
silence, the survivors on node 0 re-form without its groups and mask them, and the job ends
exactly once with the failure-free run's parameters.

Needs root and iproute2 (skipped otherwise). What it still cannot show of a second machine: its
own kernel, clock and filesystem (``--out`` is on a filesystem both "nodes" see)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from remote_job import RemoteJob, check_exact, netns as make_netns  # noqa: E402
from unbroken.events import Event  # noqa: E402
from unbroken.protocol import ExitCode  # noqa: E402
from unbroken.supervise.spec import FTConfig  # noqa: E402

pytestmark = pytest.mark.mp


@pytest.fixture
def netns():
    ns = make_netns(os.getpid())
    try:
        yield ns
    finally:
        ns.close()


#: ~2.5 ms a step once node 1 is gone: the survivors must still be training when the 1 s node
#: judgement comes (at 400 steps they sometimes finished first, and the exit of node 1's second
#: group was then accounted after the run's last step, not to the re-plan that masked it)
STEPS = 1500


@pytest.mark.timeout(300)
def test_a_node_in_its_own_network_stack_cut_off_by_its_link(tmp_path, netns):
    """Two nodes, four groups (r = 2: placement keeps each shard type on both nodes), no
    spare. Once step 4 is in, node 1's link goes down. Node 1 is lost by heartbeat silence,
    its two groups are masked by the two on node 0, and the run completes exactly once. The
    cut-off agent, unable to reach the coordinator, leaves by itself (coordinator lost)."""
    job = RemoteJob(tmp_path, 2, addr=netns.host_addr, prefixes=[[], netns.prefix()],
                    groups=4, steps=STEPS, ft=FTConfig(spares=0, node_staleness=1.0))
    try:
        # both nodes ran groups: the address each worker advertised reached the others
        job.wait_for(lambda e: e["event"] == Event.COMMIT and e["step"] >= 4)
        netns.cut()
        codes = job.finish()
    finally:
        job.close()
    events = job.sup.events
    lost = [e for e in events if e["event"] == Event.NODE_LOST]
    assert [e["node"] for e in lost] == [1] and "heartbeat" in lost[0]["reason"]
    assert not [e for e in events if e["event"] == Event.RESTART_REQUESTED]
    # after node 1's last commit, node 0's groups alone commit, masking node 1's. (Not "after
    # node_lost": the survivors' own heartbeat judges node 1's workers within 0.3 s, the
    # coordinator the node within 1 s, and on a quiet machine the survivors finished first.)
    commits = [e for e in events if e["event"] == Event.COMMIT]
    last1 = max(e["step"] for e in commits if e["src"] in ("group-1", "group-3"))
    assert last1 < STEPS - 1
    assert {e["src"] for e in commits if e["step"] > last1} == {"group-0", "group-2"}
    check_exact(job)
    # when the cut fell inside an all-reduce that completed on node 1 only (CI saw it), node
    # 1's groups committed that step alone; the ledger drops those commits and names them
    orphans = job.result.report.get("orphan_commits", [])
    assert {o["group"] for o in orphans} <= {1, 3}, orphans
    assert len({o["step"] for o in orphans}) <= 1, orphans
    # each of node 1's groups a fault of its own, answered by the survivors' replan
    per_fault = job.result.report["time_lost_per_fault"]
    assert sorted(f["group"] for f in per_fault) == [1, 3]
    assert all(f["masked"] and f["how"].startswith("replan") for f in per_fault), per_fault
    assert codes[0] == ExitCode.OK and codes[1] == ExitCode.FENCED
    err = (tmp_path / "agent-1.err").read_text()
    assert "node cut off" in err and "killed the 2 workers" in err, err[-500:]
