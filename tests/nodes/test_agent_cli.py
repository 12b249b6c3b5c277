"""``unbroken agent`` and ``run --local-nodes`` bad input as a user meets it (a subprocess):
one line naming the problem, exit 2 (``ExitCode.USAGE``), no traceback, nothing started; and
an agent woken up fenced leaves with exit 10. The
other bad node input is checked in-process (``test_node_input.py``: the same ``main``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from unbroken.protocol import ExitCode, node_fenced_key, node_key

pytestmark = pytest.mark.mp


def _one_line(p: subprocess.CompletedProcess, named: str) -> None:
    assert p.returncode == ExitCode.USAGE, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def _free_port() -> int:
    with socket.socket() as s:  # nothing listens there once it is closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def test_a_coordinator_that_cannot_be_reached_is_one_line_exit_2(cli):
    port = _free_port()
    p = cli("agent", "--coordinator", f"127.0.0.1:{port}", "--connect-timeout", "1")
    _one_line(p, f"--coordinator 127.0.0.1:{port}: cannot be reached within 1s")


@pytest.mark.timeout(60)
def test_a_node_index_claimed_twice_is_one_line_exit_2(cli):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    from unbroken.nodes.agent import claim

    assert claim(store, 0, {"pid": 4242, "host": "elsewhere"}) == 0  # a first agent's claim
    _one_line(cli("agent", "--coordinator", f"127.0.0.1:{store.port}", "--node", "0"),
              "node 0 is claimed already by the agent pid 4242 on elsewhere")


@pytest.mark.timeout(60)
def test_more_local_nodes_than_groups_is_one_line_exit_2_and_nothing_started(cli, tmp_path):
    p = cli("run", "--trainer", "mlp", "--groups", "4", "--local-nodes", "5",
            "--out", str(tmp_path / "run"))
    _one_line(p, "--local-nodes: nodes 5 exceeds the number of groups 4")
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(60)
def test_an_agent_that_wakes_up_fenced_leaves_with_exit_10():
    """A cut-off agent (SIGSTOPped) whose node the coordinator gave up: continued, it sees
    ``node_fenced/<i>``, kills what it started and exits 10 (``ExitCode.FENCED``)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    agent = subprocess.Popen([sys.executable, "-m", "unbroken", "agent", "--coordinator",
                              f"127.0.0.1:{store.port}", "--node", "3"],
                             stderr=subprocess.PIPE, text=True)
    try:
        store.wait([node_key(3)])
        agent.send_signal(signal.SIGSTOP)
        store.set(node_fenced_key(3), "its heartbeat was silent")
        agent.send_signal(signal.SIGCONT)
        assert agent.wait(timeout=30) == ExitCode.FENCED, agent.stderr.read()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


@pytest.mark.timeout(120)
def test_agents_whose_slots_do_not_hold_the_placement_stop_the_job_in_one_line(capsys,
                                                                               tmp_path):
    """Four groups on two nodes put two on each; agent 0 said ``--slots 1``. The coordinator
    (``unbroken run --nodes 2``, in-process) stops before any worker starts, with one line
    naming the node (exit 2), and every agent leaves with that line (its AgentError: exit 2).
    The agents are threads running what ``unbroken agent`` runs after its flags are parsed."""
    import threading

    from unbroken.cli import main
    from unbroken.nodes.agent import AgentError, claim, connect, follow

    port = _free_port()
    refused: dict[int, str] = {}

    def agent(k: int) -> None:
        st = connect("127.0.0.1", port, 60)
        node = claim(st, k, {"pid": k, "host": "here", "slots": 1 if k == 0 else None,
                             "spares": None})
        try:
            follow(st, "127.0.0.1", node, {}, str(tmp_path), ifname=None, connect_timeout=5)
        except AgentError as e:
            refused[k] = str(e)
    agents = [threading.Thread(target=agent, args=(k,), daemon=True) for k in range(2)]
    for a in agents:
        a.start()
    code = main(["run", "--trainer", "mlp", "--groups", "4", "--nodes", "2", "--listen",
                 str(port), "--out", str(tmp_path / "run")])
    for a in agents:
        a.join(timeout=30)
    named = "node 0: --slots 1 but the placement puts 2 groups there (4 groups on 2 nodes)"
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err.strip().splitlines()  # after the "waiting for" line
    assert err[-1] == f"unbroken: error: {named}" and "Traceback" not in "\n".join(err)
    assert refused == {0: named, 1: named}
    assert not list((tmp_path / "run" / "groups").glob("group-*.jsonl"))  # none started
