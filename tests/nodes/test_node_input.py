"""Bad node input through ``unbroken.cli.main`` in-process (nothing is started before the
check fails): one line naming the value, exit 2, no traceback."""

from __future__ import annotations

import pytest

from unbroken.cli import main


@pytest.mark.parametrize("args, named", [
    (["agent", "--coordinator", "nohost"], "--coordinator 'nohost': expected HOST:PORT"),
    (["agent", "--coordinator", "h:99999"], "expected HOST:PORT"),
    (["agent", "--coordinator", "h:1", "--node", "-1"], "--node -1: must be >= 0"),
    (["run", "--trainer", "mlp", "--groups", "4", "--faults", "node:1@3"],
     "a node fault needs node agents (--local-nodes K)"),
    (["run", "--trainer", "mlp", "--groups", "4", "--local-nodes", "2", "--faults",
      "cut:2@3"], "node 2 out of range 0..1"),
    (["run", "--trainer", "mlp", "--groups", "4", "--local-nodes", "-1"],
     "--local-nodes -1: must be >= 0"),
    (["run", "--trainer", "mlp", "--groups", "4", "--local-nodes", "2", "--node-staleness",
      "0.05"], "--node-staleness 0.05: must exceed the heartbeat period"),
    (["demo", "--groups", "4", "--local-nodes", "5"],
     "--local-nodes: nodes 5 exceeds the number of groups 4"),
    (["run", "--trainer", "mlp", "--groups", "4", "--nodes", "5"],
     "--nodes: nodes 5 exceeds the number of groups 4"),
    (["run", "--trainer", "mlp", "--groups", "4", "--nodes", "2", "--local-nodes", "2"],
     "--local-nodes and --nodes exclude each other"),
    (["run", "--trainer", "mlp", "--groups", "4", "--nodes", "2", "--listen", "70000"],
     "--listen 70000: expected a port 0..65535"),
    (["agent", "--coordinator", "h:1", "--slots", "-1"], "--slots -1: must be >= 0"),
    (["run", "--trainer", "mlp", "--groups", "4", "--local-nodes", "2", "--listen", "29500"],
     "--listen 29500: needs --nodes K"),
])
def test_bad_node_input_is_one_line_exit_2(capsys, tmp_path, args, named):
    assert main([*args, "--out", str(tmp_path / "run")] if args[0] != "agent" else args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_listen_port_taken_is_one_line_exit_2(capsys, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["run", "--trainer", "mlp", "--groups", "4", "--nodes", "2", "--listen",
                     str(port), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--listen {port}: cannot listen there" in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.mp  # the run starts its store host before it waits for the agents
def test_agents_that_never_come_are_one_line_exit_1(capsys, monkeypatch, tmp_path):
    """``--nodes 2`` and no agent: after the claim timeout, one line naming the node and how
    to start its agent; exit 1 (the run could not start), no traceback."""
    from unbroken.nodes.directory import NodeDirectory

    monkeypatch.setattr(NodeDirectory, "CLAIM_TIMEOUT_S", 0.5)
    assert main(["run", "--trainer", "mlp", "--groups", "4", "--nodes", "2",
                 "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("unbroken: run failed: node 0: no agent claimed it within 0.5s "
                              "(unbroken agent --coordinator HOST:"), err
