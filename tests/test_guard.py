"""The coordinator's log-only guard: detectors feed the ladder, decisions are journaled, and a
broken detector input never raises into the run."""

from __future__ import annotations

import math

from unbroken.guard import Guard


def run(commits, xid_lines=None, tmp_path=None):
    out: list[dict] = []
    log = None
    if xid_lines is not None:
        log = tmp_path / "kern.log"
        log.write_text("".join(x + "\n" for x in xid_lines))
    g = Guard(out.append, standby=lambda: 1, xid_log=str(log) if log else None)
    for k, loss in enumerate(commits):
        ev = {"event": "commit", "step": k, "loss": loss, "t": 100.0 + k}
        g.on_commit(ev)
        g.on_commit(dict(ev, t=ev["t"] + 0.01))  # another group's commit of the same step
        g.poll(100.0 + k)
    return out


def test_loss_jump_and_nan_are_implicit_faults_with_a_logged_ladder_decision():
    losses = [3.0 - 0.01 * k for k in range(12)] + [40.0] + [2.8] * 3 + [math.nan]
    out = run(losses)
    det = [e for e in out if e["event"] == "alert"]
    assert [(e["step"], e["kind"]) for e in det] == [(12, "jump"), (16, "nan")]
    lad = [e for e in out if e["event"] == "ladder"]
    assert len(lad) == 2 and all(e["mode"] == "log-only" for e in lad)
    # an implicit failure names no culprit: the ladder starts at retry in place (byterobust §2)
    assert lad[0]["rung"] == "retry" and lad[0]["for"] == "numeric jump"


def test_no_false_alarm_on_a_normal_loss_curve():
    assert run([5.5 * 0.98 ** k for k in range(60)]) == []


def test_xid_lines_map_to_the_catalog_and_malformed_ones_only_warn(tmp_path):
    out = run([3.0] * 3, [
        "[ 12.5] NVRM: Xid (PCI:0000:3b:00): 43, pid=77, Ch 00000008",
        "[ 13.0] NVRM: Xid (PCI:0000:3b:00): what",
        "[ 14.0] usb 1-1: new device",
    ], tmp_path)
    (det,) = [e for e in out if e["event"] == "alert"]
    assert det["code"] == 43 and det["action"] == "restart_app"
    (lad,) = [e for e in out if e["event"] == "ladder"]
    assert lad["rung"] == "retry" and lad["mode"] == "log-only"
    (warn,) = [e for e in out if e["event"] == "detector_warning"]
    assert warn["detector"] == "xid" and "line 2" in warn["message"]


def test_a_broken_detector_is_switched_off_once_not_raised():
    out: list[dict] = []
    g = Guard(out.append)
    for k in range(3):
        g.on_commit({"event": "commit", "step": k, "loss": "not a number", "t": 1.0})
    warns = [e for e in out if e["event"] == "detector_warning"]
    assert len(warns) == 1 and warns[0]["detector"] == "numeric"


def test_a_grad_norm_jump_is_an_implicit_fault_too():
    out: list[dict] = []
    g = Guard(out.append)
    for k in range(62):
        gn = 40.0 if k in (12, 60) else 1.0 + 0.01 * k  # early swings are not judged
        g.on_commit({"event": "commit", "step": k, "loss": 3.0, "grad_norm": gn, "t": 1.0 + k})
    (alert,) = [e for e in out if e["event"] == "alert"]
    assert alert["signal"] == "grad_norm" and alert["step"] == 60 and alert["kind"] == "jump"
    (lad,) = [e for e in out if e["event"] == "ladder"]
    assert lad["rung"] == "retry" and "grad norm" in lad["for"]


def test_a_node_above_its_peers_for_three_samples_is_one_alert_until_it_falls_back():
    out: list[dict] = []
    g = Guard(out.append)
    quiet = {"event": "node_health", "cpus": 2, "load1": 1.0, "mem_avail_mb": 12000,
             "mem_total_mb": 16000, "disk_free_mb": 5e4}

    def second(t: float, busy: float) -> None:  # every node's sample of one second
        for n in range(4):
            g.on_node_health(dict(quiet, node=n, t=t + 0.01 * n, load1=busy if n == 2 else 1.0))

    def peers_alerts() -> list[dict]:
        return [e for e in out if e["event"] == "alert" and e["how"] == "node_peers"]

    second(0.0, 1.0)
    second(1.0, 3.6)  # 1.8 per CPU: under the fixed floor (2.0), three times the peers'
    second(2.0, 3.6)
    assert peers_alerts() == []                  # two samples above: not yet
    second(3.0, 3.6)
    [a] = peers_alerts()
    assert a["node"] == 2 and a["signal"] == "load_per_cpu" and a["group"] is None
    assert "node 2: load_per_cpu 1.80" in a["reason"] and "3 samples in a row" in a["reason"]
    assert not any(e["event"] == "alert" and e["how"] == "node_health" for e in out)  # under the floor
    second(4.0, 3.6)
    assert len(peers_alerts()) == 1              # once while it lasts
    second(5.0, 1.0)
    for t in (6.0, 7.0, 8.0):
        second(t, 3.6)
    assert len(peers_alerts()) == 2              # fell back, then stood out again


def test_a_node_that_stopped_reporting_is_no_peer():
    out: list[dict] = []
    g = Guard(out.append)
    s = {"event": "node_health", "cpus": 2, "load1": 1.0, "mem_avail_mb": 12000,
         "mem_total_mb": 16000}
    for n in range(4):
        g.on_node_health(dict(s, node=n, t=0.0))
    for t in (10.0, 11.0, 12.0, 13.0):  # nodes 0 and 1 went silent at t=0: two peers left
        g.on_node_health(dict(s, node=2, t=t, load1=6.0))
        g.on_node_health(dict(s, node=3, t=t))
    assert not any(e["event"] == "alert" and e["how"] == "node_peers" for e in out)
