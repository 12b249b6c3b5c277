"""`unbroken demo` end to end, shortened: a real subprocess, real worker processes, the default
kinds of fault (a kill, a hang, two close together -> a wipe-out restart), its JSON and files."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import read_journal  # noqa: E402

from unbroken.core.ettr import ettr_report  # noqa: E402

pytestmark = pytest.mark.mp


@pytest.mark.timeout(300)
def test_demo_masks_faults_restarts_and_matches_the_failure_free_run(demo, tmp_path):
    rep = demo("--steps", "30", "--seed", "1", "--faults", "kill:1@5,hang:3@12,kill:2@13",
               "--out", str(tmp_path), timeout=280)
    assert rep["steps"] == 30 and rep["faults_injected"] == 3
    # kill and hang masked; the kill right after the hang wipes out types 2 and 3 -> restart
    assert rep["faults_masked"] == 2 and rep["restarts"] == 1 and rep["joins"] == 3
    assert rep["exactly_once"] is True and rep["ledger"]["records"] == 30 * 4
    assert rep["max_abs_param_diff"] < 1e-5
    kinds = [(f["kind"], f["group"], f["step"], f["masked"]) for f in rep["time_lost_per_fault"]]
    assert kinds == [("kill", 1, 5, True), ("hang", 3, 12, True), ("kill", 2, 13, False)]
    events = read_journal(tmp_path / "journal.jsonl")
    # the report's time accounting is its journal's, and the faults cost time: the hang (a
    # heartbeat timeout) and the wipe-out (a restart) each lose some, so ETTR is below 1
    assert rep["ettr"] == pytest.approx(ettr_report(events).ettr) and rep["ettr"] < 1
    lost = [f["lost_s"] for f in rep["time_lost_per_fault"]]
    assert lost[1] > 0 and lost[2] > 0, lost
    assert rep["wall_s"] > rep["train_s"]  # the demo's wall time includes the start-up
    assert events[0]["event"] == "start" and events[-1]["event"] == "end"
    how = {e["slot"]: e["how"] for e in events if e["event"] == "detected"}
    assert how == {1: "exit", 3: "heartbeat", 2: "exit"}  # the hang was found by heartbeat
    png = (tmp_path / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.timeout(200)
def test_demo_without_faults_is_plain_data_parallelism(demo, tmp_path):
    rep = demo("--steps", "12", "--faults", "none", "--spares", "0", "--out", str(tmp_path))
    assert rep["faults_injected"] == 0 and rep["restarts"] == 0 and rep["joins"] == 0
    assert rep["exactly_once"] is True and rep["max_abs_param_diff"] < 1e-9


@pytest.mark.timeout(300)
def test_demo_wipeout_without_spares_is_answered_by_the_ladder(demo, tmp_path):
    # no spare: the wipe-out at step 9 cannot be covered from the pool; the ladder retries in
    # place (fresh processes in both dead slots, the survivors restore their snapshot); with
    # retry switched off it restarts every group from the checkpoint of step 5, the steps
    # 5..8 done twice counting once (the restore rolls back)
    rep = demo("--steps", "16", "--spares", "0", "--faults", "kill:1@8,kill:2@9",
               "--ckpt-every", "5", "--out", str(tmp_path / "retry"))
    assert rep["faults_masked"] == 1 and rep["restarts"] == 1
    assert rep["exactly_once"] is True and rep["ledger"]["records"] == 16 * 4
    assert rep["max_abs_param_diff"] < 1e-5
    assert rep["time_lost_per_fault"][1]["how"].startswith("restart from snapshot")
    events = read_journal(tmp_path / "retry" / "journal.jsonl")
    rungs = [(e["for"], e["rung"]) for e in events if e["event"] == "ladder"]
    assert rungs == [("death group 1", "mask"), ("wipe-out: slots [1, 2] have no live holder",
                                                 "retry")], rungs
    assert sorted(e["slot"] for e in events if e["event"] == "assign" and e.get("fresh")) \
        == [1, 2]

    rep = demo("--steps", "16", "--spares", "0", "--faults", "kill:1@8,kill:2@9",
               "--ckpt-every", "5", "--ladder", "retry=0", "--out", str(tmp_path / "restart"))
    assert rep["faults_masked"] == 1 and rep["restarts"] == 1
    assert rep["exactly_once"] is True and rep["ledger"]["records"] == 16 * 4
    assert rep["max_abs_param_diff"] < 1e-5
    assert rep["time_lost_per_fault"][1]["how"] == "restart from checkpoint @ step 5"
