"""Agents as another machine runs them: ``unbroken agent --coordinator ADDR:PORT`` started by
hand (separate processes, not ``--local-nodes``), given this host's non-loopback address, and
``unbroken run --nodes K --listen PORT`` waiting for them. A node killed from outside is found
by its silence alone (the coordinator did not start it) and masked, exactly once; a wipe-out
restart makes a new attempt store, and the agent left carries the job on to its end.

A second network stack is in ``test_netns_agents.py``. What one machine cannot show: a second
host's kernel and firewall, and a run directory on a shared filesystem (here every "node" sees
/tmp)."""

from __future__ import annotations

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

from remote_job import RemoteJob, check_exact  # noqa: E402
from unbroken.events import Event  # noqa: E402
from unbroken.protocol import ExitCode  # noqa: E402
from unbroken.supervise.spec import FTConfig  # noqa: E402

pytestmark = pytest.mark.mp


@pytest.mark.timeout(300)
def test_remote_agents_a_node_killed_from_outside_and_a_restart_on_the_nodes_left(tmp_path):
    """Two agents, four groups, no spare. Agent 1 is SIGKILLed from outside once step 4 is
    in: only its silence tells (the coordinator did not start it). Group 0 kills itself at
    step 40 (a drill, late enough for a busy machine's test thread that sees step 4 late);
    with node 1's groups gone that is a wipe-out (in whichever order the two land), so the
    ladder restarts from the last checkpoint in a new attempt with a new store, placed on
    the node left: agent 0, the same process, runs all four groups to the end, exactly
    once, and leaves with exit 0."""
    # node silence at 2 s: beside a busy loop and the 32-group test, agent 0's heartbeat
    # once stalled 1.04 s while its node started the restart's four groups, and the job
    # ended with every node lost (the rule was right; the margin was the test's)
    job = RemoteJob(tmp_path, 2, groups=4, steps=80, faults="kill:0@40",
               ft=FTConfig(spares=0, ckpt_every=5, ladder="retry=0", node_staleness=2.0))
    try:
        job.wait_for(lambda e: e["event"] == Event.COMMIT and e["step"] >= 4)
        t_kill = time.time()
        os.killpg(job.agents[1].pid, signal.SIGKILL)  # the agent, its fork server, workers
        codes = job.finish()
    finally:
        job.close()
    events = job.sup.events
    lost = [e for e in events if e["event"] == Event.NODE_LOST]
    assert len(lost) == 1 and lost[0]["node"] == 1 and "heartbeat" in lost[0]["reason"]
    # node 1 of 2 holds groups 1 and 3; when the restart came first (the members' own 0.3 s
    # heartbeat rule found them before the node's 2 s silence), the directory's look before
    # the restart finds the node, with no member left there
    assert set(lost[0]["uids"]) in ({1, 3}, set())
    print(f"remote node loss noticed {lost[0]['t'] - t_kill:.3f}s after the kill")
    assert len([e for e in events if e["event"] == Event.RESTART_REQUESTED]) == 1
    restart = next(e["t"] for e in events if e["event"] == Event.RESTART_REQUESTED)
    after = {e["src"] for e in events if e["event"] == Event.COMMIT and e["t"] > restart}
    assert after == {f"group-{g}" for g in range(4)}  # all four, on node 0 alone
    check_exact(job)
    assert codes == [ExitCode.OK, -signal.SIGKILL]


@pytest.mark.timeout(300)
def test_a_cut_off_remote_node_rejoins_as_spare_capacity(tmp_path):
    """Agent 1 (``--rejoin``) is SIGSTOPped: fenced by its silence, its groups masked and
    replaced elsewhere. Continued, it kills what it ran, asks to come back and beats: the
    coordinator lifts the fence. A spare is started there again, the least loaded node:
    a refill for slots 1 and 4 when the fence lifted before their spares were used, else the
    one after group 0 is killed from outside (the others hold 2 processes each, node 1
    none). The job is then stopped (every member after the same step, exactly once) and
    agent 1 stays to the end (exit 0, not 10)."""
    import json

    from unbroken.protocol import STOP_KEY, node_order_key, node_orders_key, node_pid_key

    # the test stops the job itself: 600 steps ran out first under a busy loop (the node's
    # fence, lift and the two re-admissions take seconds; the MLP's steps a millisecond), and
    # 20,000 once beside a stray busy loop; nothing in a run grows with its step budget
    job = RemoteJob(tmp_path, 3, groups=6, steps=1_000_000, agent_args=["--rejoin"],
               ft=FTConfig(node_staleness=1.0))
    try:
        job.wait_for(lambda e: e["event"] == Event.COMMIT and e["step"] >= 4)
        job.agents[1].send_signal(signal.SIGSTOP)  # the agent only: its workers run on
        # node 1's loss: a fresh clone's suite had node 2 lost first, silent 1.03 s at the
        # start under load; continued at once, agent 1 was never lost and never rejoined
        job.wait_for(lambda e: e["event"] == Event.NODE_LOST and e["node"] == 1)
        att = job.attempt_store()
        before = int(att.add(node_orders_key(1), 0))  # fenced: nothing is started there now
        job.agents[1].send_signal(signal.SIGCONT)
        job.wait_for(lambda e: e["event"] == Event.NODE_REJOINED and e["node"] == 1)
        for slot in (1, 4):  # node 1's slots held again (by spares elsewhere) before a kill
            job.wait_for(lambda e: e["event"] == Event.JOIN and e["slot"] == slot)
        for uid in (0, 3, 2, 5):  # node 0's groups first; a group that was left out under
            try:                   # load (and replaced by a spare) is gone already
                os.kill(int(att.get(node_pid_key(uid))), signal.SIGKILL)
                break
            except ProcessLookupError:
                continue

        def orders() -> dict:  # every node's orders, for the failure message
            return {k: [(o["op"], o.get("uid")) for o in (
                json.loads(att.get(node_order_key(k, i)))
                for i in range(1, int(att.add(node_orders_key(k), 0)) + 1))]
                for k in range(3)}
        deadline, spawned = time.monotonic() + 60, []
        # a CI run continued agent 1 so soon that it rejoined before slots 1 and 4 took their
        # spares: both refills went to node 1, and the one after the kill to node 0 (a 2-2-2
        # tie); the test waited in vain for a third
        while not spawned:  # a spare started on node 1 since its fence
            assert time.monotonic() < deadline and job.thread.is_alive(), (
                f"no spawn on node 1 after its order {before}: {orders()}")
            n = int(att.add(node_orders_key(1), 0))
            spawned = [json.loads(att.get(node_order_key(1, i)))["op"]
                       for i in range(before + 1, n + 1)]
            spawned = [op for op in spawned if op == "spawn"]
            time.sleep(0.02)  # polling the store the test does not own: no wake-up to wait on
        att.add(STOP_KEY, 1)  # seen: the rest of the run would show nothing more
        codes = job.finish()
    finally:
        for a in job.agents:
            if a.poll() is None:
                a.send_signal(signal.SIGCONT)
        job.close()
    res = job.result  # stopped on purpose after the spawn: every member after one step
    assert res.checkpoint and res.report["exactly_once"] is True, res.message
    assert codes == [ExitCode.OK, ExitCode.OK, ExitCode.OK]
