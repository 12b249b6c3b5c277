"""`unbroken demo` end to end, shortened: a real subprocess, real worker processes, the default
kinds of fault (a kill, a hang, two close together -> a wipe-out restart, unless the first one's
spare is in before the second), its JSON and files."""

from __future__ import annotations

from pathlib import Path

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
    assert rep["joins"] == 3  # a spare group for each dead slot
    assert rep["exactly_once"] is True and rep["ledger"]["records"] == 30 * 4
    assert rep["max_abs_param_diff"] < 1e-5
    events = read_journal(tmp_path / "journal.jsonl")
    # the kill one step after the hang wipes out types 2 and 3 -> a restart, unless the hung
    # slot's spare was admitted at the start of that step, before the kill: a race the
    # machine's load decides (a loaded CI run found the hang 0.37 s after it, admitted the
    # spare 0.22 s later and the kill came 0.14 s after that). Either way is correct; each
    # is checked for what it must show
    kill_t = next(e["t"] for e in events if e["event"] == "fault" and e["group"] == 2)
    spare_first = any(e["event"] == "admit" and 3 in e["joined"].values() and e["t"] < kill_t
                      for e in events)  # the members' own admission of slot 3's spare
    kinds = [(f["kind"], f["group"], f["step"], f["masked"]) for f in rep["time_lost_per_fault"]]
    lost = [f["lost_s"] for f in rep["time_lost_per_fault"]]
    if spare_first:  # three masks, no restart
        assert rep["faults_masked"] == 3 and rep["restarts"] == 0, rep
        assert kinds == [("kill", 1, 5, True), ("hang", 3, 12, True), ("kill", 2, 13, True)]
        assert not any(e["event"] in ("wipeout", "restart") for e in events)
    else:  # kill and hang masked, then the wipe-out restarts from memory
        assert rep["faults_masked"] == 2 and rep["restarts"] == 1, rep
        assert kinds == [("kill", 1, 5, True), ("hang", 3, 12, True), ("kill", 2, 13, False)]
        assert lost[2] > 0, lost  # a restart costs time
    # the report's time accounting is its journal's, and the faults cost time: the hang (a
    # heartbeat timeout) loses some, so ETTR is below 1
    assert rep["ettr"] == pytest.approx(ettr_report(events).ettr) and rep["ettr"] < 1
    assert lost[1] > 0, lost
    assert rep["wall_s"] > rep["train_s"]  # the demo's wall time includes the start-up
    assert events[0]["event"] == "start" and events[-1]["event"] == "end"
    how = {e["slot"]: e["how"] for e in events if e["event"] == "detected"}
    assert how == {1: "exit", 3: "heartbeat", 2: "exit"}  # the hang was found by heartbeat
    # the hung process was dumped before its kill: its stacks say where it stopped
    hung = next(e for e in events if e["event"] == "detected" and e["how"] == "heartbeat")
    text = Path(hung["stacks"]).read_text()
    assert f"uid {hung['group']} pid" in text and "run_step" in text, text[:2000]
    # and the survivors journal why their generation broke: one of them saw it go silent
    causes = [e.get("cause") for e in events if e["event"] == "replan"]
    assert any(c and "stale heartbeat: [3]" in c for c in causes), causes
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
    # place (fresh processes in both dead slots, the survivors keep their committed state); with
    # retry switched off it restarts every group from the checkpoint of step 5, the steps
    # 5..8 done twice counting once (the restore rolls back)
    rep = demo("--steps", "16", "--spares", "0", "--faults", "kill:1@8,kill:2@9",
               "--ckpt-every", "5", "--out", str(tmp_path / "retry"))
    assert rep["faults_masked"] == 1 and rep["restarts"] == 1
    assert rep["exactly_once"] is True and rep["ledger"]["records"] == 16 * 4
    assert rep["max_abs_param_diff"] < 1e-5
    assert rep["time_lost_per_fault"][1]["how"].startswith("restart from memory")
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


@pytest.mark.timeout(200)
def test_demo_guard_logs_xid_decisions_without_disturbing_training(demo, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[ 1234.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off "
                   "the bus.\n[ 1235.0] NVRM: Xid (PCI:0000:3b:00): garbage\n")
    rep = demo("--steps", "12", "--faults", "none", "--spares", "0", "--xid-log", str(log),
               "--out", str(tmp_path / "d"))
    assert rep["exactly_once"] is True and rep["max_abs_param_diff"] < 1e-9
    events = read_journal(tmp_path / "d" / "journal.jsonl")
    (det,) = [e for e in events if e["event"] == "alert" and e["how"] == "xid"]
    assert det["code"] == 79 and det["action"] == "reboot_node"
    (lad,) = [e for e in events if e["event"] == "ladder"]
    assert lad["mode"] == "log-only" and lad["for"] == "xid 79"
    assert any(e["event"] == "detector_warning" and "line 2" in e["message"] for e in events)


@pytest.mark.timing
@pytest.mark.timeout(200)
def test_demo_guard_flags_a_straggler_within_the_configured_rounds(demo, tmp_path):
    # group 2 computes 60 ms slower per shard from step 10; without spares, group 0 carries
    # a stack of two after the kill of group 1 and must not be taken for a straggler
    rep = demo("--steps", "90", "--spares", "0", "--faults", "kill:1@5,slow:2@10",
               "--out", str(tmp_path))
    assert rep["exactly_once"] is True and rep["max_abs_param_diff"] < 1e-9
    events = read_journal(tmp_path / "journal.jsonl")
    slow = [e for e in events if e["event"] == "fault" and e["kind"] == "slow"]
    alerts = [e for e in events if e["event"] == "alert" and e["how"] == "fail-slow"]
    assert [a["group"] for a in alerts] == [2], alerts
    # 5 closed rounds of 1 s after the onset (4.7 s in bench/detect_latency.py); the bound is
    # loose because a loaded CI machine stretches rounds, the bench measures the latency
    assert 0 < alerts[0]["t"] - slow[0]["t"] < 20.0
    # the kill is answered by the ladder's mask rung (acted on: the runtime's baseline); the
    # straggler only journaled (log-only)
    lads = {e["for"]: e for e in events if e["event"] == "ladder"}
    assert lads["death group 1"]["rung"] == "mask" and lads["death group 1"]["mode"] == "act"
    assert lads["fail-slow group 2"]["mode"] == "log-only"


@pytest.mark.timing
@pytest.mark.timeout(200)
def test_acting_guard_evicts_the_straggler_and_a_spare_takes_its_slot(demo, tmp_path):
    rep = demo("--steps", "110", "--faults", "slow:2@10", "--guard", "act", "--spares", "2",
               "--out", str(tmp_path))
    assert rep["exactly_once"] is True and rep["max_abs_param_diff"] < 1e-9
    assert rep["joins"] == 1
    events = read_journal(tmp_path / "journal.jsonl")
    (lad,) = [e for e in events if e["event"] == "ladder"]
    assert lad["mode"] == "act" and lad["rung"] == "mask" and lad["groups"] == [2]
    (det,) = [e for e in events if e["event"] == "detected"]
    assert det["how"] == "fail-slow" and det["slot"] == 2
    (join,) = [e for e in events if e["event"] == "join"]
    assert join["slot"] == 2
    # slot 2's own compute per shard: the straggler's (+60 ms) before, its peers' after
    before = [e["compute_s"] for e in events if e["event"] == "commit"
              and e["src"] == "group-2" and e["step"] > 12]
    after = [e["compute_s"] for e in events if e["event"] == "commit"
             and e["src"] == f"group-{join['uid']}" and e["step"] > join["step"] + 2]
    assert before and after
    # the straggler's 60 ms per shard is gone; the rest of a shard's compute time stretches
    # with the machine's load (0.05-0.1 s on a busy 2-core box), so compare the difference
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    assert median(before) - median(after) > 0.03, (median(before), median(after))
    assert next(e["t"] for e in events if e["event"] == "fault") < det["t"]


@pytest.mark.timeout(200)
def test_stall_invisible_to_heartbeats_is_localised_by_stacks_and_evicted(demo, tmp_path):
    # group 2's training thread blocks for good at step 10 while its heartbeat goes on: no
    # heartbeat, no exit, no gloo error. The acting guard sees no step for 3 s, dumps every
    # member's stacks, finds the odd one out, evicts it; the runtime masks it, a spare joins.
    rep = demo("--steps", "30", "--faults", "stall:2@10", "--guard", "act",
               "--out", str(tmp_path))
    assert rep["steps"] == 30 and rep["exactly_once"] is True
    assert rep["max_abs_param_diff"] < 1e-9 and rep["joins"] == 1
    events = read_journal(tmp_path / "journal.jsonl")
    (alert,) = [e for e in events if e["event"] == "alert"]
    assert alert["how"] == "stack" and alert["group"] == [2], alert
    (det,) = [e for e in events if e["event"] == "detected"]
    assert det["how"] == "stack" and det["slot"] == 2
