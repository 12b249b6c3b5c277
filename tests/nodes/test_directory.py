"""The job's node directory (``unbroken.nodes.directory``) on its own: a store host process
and store clients standing in for the agents."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.mp


@pytest.mark.timeout(60)
def test_before_a_restart_a_node_whose_agent_stopped_beating_is_fenced():
    """Between attempts nobody judges the agents' silence: the directory looks once before a
    restart. Node 0's agent beats (its heartbeat thread), node 1's claimed and died."""
    from unbroken.nodes.agent import _Beat, claim
    from unbroken.nodes.directory import NodeDirectory
    from unbroken.protocol import node_fenced_key, node_left_key

    d = NodeDirectory(2)
    try:
        for k in range(2):
            claim(d.store.clone(), k, {"pid": k})
        beat = _Beat(d.store, 0, 0.05)
        d.store.add("node_hb/1", 1)  # its one beat, long ago
        d.claims()
        silent = d.fence_silent(1.5)  # node 0 beats every 0.05 s: room for a busy machine
        beat.stop()
        assert list(silent) == [1] and "did not move for 1.5s" in silent[1]
        assert d.live() == [0] and d.store.check([node_fenced_key(1)])
        d.store.set(node_left_key(0), "1")  # node 0's agent read the job's end
    finally:
        d.close()
