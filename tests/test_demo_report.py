"""The demo's summary, figure and live view, fed a synthetic journal."""

import json

import pytest
from rich.console import Console

from helpers import DATA, commit_lines, read_journal

from unbroken.demo_report import build_report, plot_demo, print_report
from unbroken.demo_view import LiveView

T0 = 2000.0
CFG = {"groups": 4, "redundancy": 2, "steps": 100, "seed": 0}


def commits(step, t, members, loss):
    return commit_lines(step, t, members, loss, gen=1, gap=0.002)


def demo_journal():
    """kill 1 @20 masked (1 s); hang 3 @40 masked (2 s, heartbeat); kill 2 @41 wipes out,
    restart from the snapshot of step 38, spares 4 and 5 join; 100 steps at 0.1 s."""
    ev = [{"event": "start", "t": T0 - 3, "src": "driver", "config": CFG,
           "faults": [{"kind": "kill", "group": 1, "step": 20}]}]
    t, members = T0, [0, 1, 2, 3]

    def masked(k, g, kind, extra, how):
        nonlocal t, members
        tf = t + 0.01
        ev.append({"event": "fault", "kind": kind, "group": g, "step": k, "t": tf})
        ev.append({"event": "detected", "group": g, "how": how, "t": tf + extra * 0.5})
        members = [m for m in members if m != g]
        for m in members:
            ev.append({"event": "replan", "step": k, "gen": 2, "members": members,
                       "phase": "fixed", "depth": 2, "patch": {str(m): [g]}, "reason": "r",
                       "reform_at": tf + extra * 0.4, "t": tf + extra * 0.6})
        t += extra

    for k in range(41):
        if k == 20:
            masked(20, 1, "kill", 1.0, "exit")
        if k == 40:
            masked(40, 3, "hang", 2.0, "heartbeat")
        t += 0.1
        ev += commits(k, t, members, 5.0 - 0.02 * k)
    tf = t + 0.01
    ev.append({"event": "fault", "kind": "kill", "group": 2, "step": 41, "t": tf})
    ev.append({"event": "wipeout", "step": 41, "members": [0], "lost_types": [1, 2],
               "reason": "types 1, 2 have no live copy", "t": tf + 0.2})
    ev.append({"event": "restart", "step": 38, "reason": "wipe-out", "source": "memory",
               "t_ready": tf + 1.5, "t": tf + 0.3})
    ev.append({"event": "join", "uid": 4, "slot": 1, "step": 38, "t": tf + 1.4})
    ev.append({"event": "join", "uid": 5, "slot": 2, "step": 38, "t": tf + 1.45})
    t, members = tf + 1.5, [0, 4, 5]
    for k in range(38, 100):
        t += 0.1
        ev += commits(k, t, members, 5.0 - 0.02 * k)
    ev.append({"event": "end", "wall_s": t - T0 + 4.0, "t": t + 0.2})
    return ev


def test_build_report_counts_masked_and_restarts():
    rep = build_report(demo_journal(), max_abs_param_diff=0.0, exactly_once=True,
                       ledger={"records": 400})
    json.dumps(rep)  # JSON-ready
    assert rep["steps"] == 100 and rep["steps_planned"] == 100
    assert (rep["faults_injected"], rep["faults_masked"], rep["restarts"]) == (3, 2, 1)
    assert rep["joins"] == 2 and rep["exactly_once"] is True and rep["ledger"] == {"records": 400}
    assert rep["step_s"] == pytest.approx(0.1)
    lost = [f["lost_s"] for f in rep["time_lost_per_fault"]]
    # wipe-out: from commit 40 to ready + 0.1 (redo of 38), then 39, 40 redone; 41 on time
    assert lost == pytest.approx([1.0, 2.0, 1.61 + 0.2])
    assert [f["masked"] for f in rep["time_lost_per_fault"]] == [True, True, False]
    assert rep["ettr"] == pytest.approx(10.0 / (10.0 + sum(lost)))
    assert rep["wall_s"] == pytest.approx(rep["train_s"] + 4.0)
    assert rep["final_loss"] == pytest.approx(5.0 - 0.02 * 99)


def test_print_report_renders_the_numbers():
    rep = build_report(demo_journal(), max_abs_param_diff=1.5e-7, exactly_once=False)
    con = Console(record=True, width=140)
    print_report(con, rep)
    out = con.export_text()
    for s in ("ETTR", "masked without restart", "Time lost per fault", "kill group 2 @ step 41",
              "restart from memory", "NO", "1.5e-07"):
        assert s in out


def test_plot_demo_writes_a_png(tmp_path):
    p = plot_demo(demo_journal(), tmp_path / "sub" / "demo.png")
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert not (tmp_path / "sub" / "demo.png.tmp").exists()
    # no faults, no restart: still a figure
    q = plot_demo([e for e in demo_journal()[:30]], tmp_path / "small.png")
    assert q.read_bytes()[:4] == b"\x89PNG"


def test_live_view_shows_step_loss_dead_group_and_the_story():
    view = LiveView(CFG)
    lines = [view.update(e) for e in demo_journal()[:200]]
    con = Console(record=True, width=120)
    con.print(view)
    out = con.export_text()
    assert "step " in out and "/100" in out
    assert f"loss {view.loss:.4f}" in out
    assert "g1 dead" in out and "g3 hung" in out
    assert "ETTR" in out
    told = [x for x in lines if x]
    assert any("kill group 1" in x and "masked by replan (phase fixed, depth 2)" in x
               for x in told)
    assert any("detected by heartbeat" in x for x in told)
    assert "depth 2" in out


def test_live_view_wipeout_restart_join_and_plain_lines():
    view = LiveView({})  # config arrives with the start line
    told = [x for x in map(view.update, demo_journal()) if x]
    assert view.total == 100 and view.step == 99
    assert any("WIPE-OUT" in x for x in told) and any("restart at step 38" in x for x in told)
    assert any("spare group 4 joined as slot 1" in x for x in told)
    assert sum("replan" in x for x in told) == 2  # journaled by every survivor, told once
    assert all("\n" not in x for x in told)  # one plain line per event for a non-terminal
    con = Console(record=True, width=120, force_terminal=False)
    con.print(view)
    out = con.export_text()
    assert "g4@1 spare" in out and "done in" in out
    assert len(view.lines) <= 8


def test_chaos11_report_and_live_view_give_each_fault_its_own_outcome():
    # issue 9: the guard's restore of the bit flip was booked under the slow fault of step 22
    ev = read_journal(DATA / "chaos11_trimmed.jsonl")
    rows = {f["kind"]: f for f in build_report(ev, max_abs_param_diff=None,
                                               exactly_once=True)["time_lost_per_fault"]}
    assert rows["slow"]["masked"] and rows["slow"]["how"] == "replan (phase free, depth 2)"
    assert not rows["flip"]["masked"] and "restore @ step 40" in rows["flip"]["how"]
    assert rows["flip"]["lost_s"] > rows["slow"]["lost_s"] > 0
    con = Console(record=True, width=160)
    print_report(con, build_report(ev, max_abs_param_diff=None, exactly_once=True))
    table = con.export_text().splitlines()
    assert any("slow group 1 @ step 22" in x and "replan (phase free, depth 2)" in x
               for x in table)
    assert any("flip group 3 @ step 40" in x and "evict, restore @ step 40" in x for x in table)
    assert not any("slow group 1" in x and "restart" in x for x in table)

    view = LiveView(CFG)
    told = [x for x in map(view.update, sorted(ev, key=lambda e: e["t"])) if x]
    assert any(x.startswith("step 22   slow group 1") and "masked by replan" in x
               for x in told)
    assert not any("slow" in x and "restore" in x for x in told)


def test_a_nodes_machine_alert_names_the_node_and_its_problem():
    view = LiveView(CFG)
    line = view.update({"event": "alert", "how": "node_health", "node": 1, "signal": "disk",
                        "group": None, "reason": "512 MiB free on the run directory's "
                        "filesystem", "t": T0})
    assert "ALERT node_health node 1: 512 MiB free" in line
    assert view.update({"event": "node_health", "node": 1, "load1": 1.0, "t": T0}) is None
