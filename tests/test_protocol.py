"""The store keys of ``unbroken.protocol`` are the wire format: each function must give exactly
the string every earlier version of the runtime formatted inline (a journal, a test or a running
job of the previous version reads them)."""

from __future__ import annotations

import re
from pathlib import Path

from unbroken import protocol as p

SRC = Path(__file__).resolve().parent.parent / "src" / "unbroken"


def test_key_functions_give_the_old_strings():
    assert p.SUPERVISOR_HB == "hb/supervisor"
    assert p.STOP_KEY == "ctl/stop"
    assert p.JOIN_COUNT == "join/count"
    assert p.CODE_COUNT == "code/count"
    assert p.DEAD_EPOCH == "dead/epoch"
    one = {p.hb_key: "hb/7", p.dead_key: "dead/7", p.done_key: "done/7", p.error_key: "error/7",
           p.killed_key: "killed/7", p.stopped_key: "stopped/7", p.standby_key: "standby/7",
           p.assign_key: "assign/7", p.drill_key: "drill/7", p.join_key: "join/7",
           p.admit_key: "admit/7",
           p.wipeout_key: "wipeout/7", p.wipeout_failed_key: "wipeout_failed/7",
           p.code_key: "code/7"}
    for f, want in one.items():
        assert f(7) == want, f.__name__
    two = {p.state_key: "state/3/12", p.incident_key: "incident/3/12",
           p.verdict_key: "verdict/3/12", p.replay_key: "replay/3/12"}
    for f, want in two.items():
        assert f(3, 12) == want, f.__name__


def test_every_key_function_is_exported_and_covered():
    names = {n for n in p.__all__ if n.endswith("_key")}
    assert names == {n for n in dir(p) if n.endswith("_key") and callable(getattr(p, n))}
    assert len(names) == 35


def test_takeover_keys():
    assert (p.COORD_EPOCH, p.ADOPTED) == ("coord/epoch", "coord/adopted")
    assert p.reattach_key(7) == "reattach/7" and p.exit_key(7) == "exit/7"


def test_node_agent_keys():
    assert p.NODE_EXITS == "node/exits"
    one = {p.node_key: "node/2", p.node_hb_key: "node_hb/2", p.node_fenced_key: "node_fenced/2",
           p.node_orders_key: "node_orders/2", p.node_exit_key: "node_exit/2",
           p.node_pid_key: "node_pid/2"}
    for f, want in one.items():
        assert f(2) == want, f.__name__
    assert p.node_order_key(2, 5) == "node_order/2/5"
    assert p.ExitCode.FENCED == 10
    # the directory's (unbroken.nodes.directory) and the agents' newer keys
    assert (p.JOB_NODES, p.JOB_ATTEMPTS) == ("job/nodes", "job/attempts")
    assert p.job_attempt_key(3) == "job/attempt/3"
    assert p.node_error_key(2) == "node_error/2" and p.node_left_key(2) == "node_left/2"
    assert p.node_stacks_key(2, 5) == "node_stacks/2/5"
    assert p.node_rejoin_key(2) == "node_rejoin/2"
    assert p.node_health_key(2) == "node_health/2" and p.node_xids_key(2) == "node_xids/2"
    assert p.node_xid_key(2, 5) == "node_xid/2/5"


# the building blocks' private keys: ftcomm's rendezvous, its abort flags and doorbells, and
# the probe worker's results
_PRIVATE = {"runtime/ftcomm_rendezvous.py": ("rdzv/", "pg/"),
            "runtime/ftcomm_heartbeat.py": ("abort/", "bell/"),
            "runtime/ftcomm_worker.py": ("result/", "first/")}


def test_no_store_key_is_formatted_outside_protocol():
    bad = []
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC).as_posix()
        if rel == "protocol.py":
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for m in re.finditer(r"""f["']([a-z_]+/)""", code):
                if m.group(1) not in _PRIVATE.get(rel, ()) and "``" not in line:
                    bad.append(f"{rel}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)
