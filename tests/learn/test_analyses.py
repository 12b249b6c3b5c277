"""Analyses 2-6 against the synthetic truth and against hand-made cases."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from unbroken.core import ckpt_io, history, measured, memrules
from unbroken.learn.analyze import Inputs, analyze
from unbroken.learn.sacct import parse_sacct
from unbroken.learn.synth import sacct_lines


@pytest.fixture(scope="module")
def result(small):
    jobs, _ = parse_sacct(sacct_lines(small))
    data, _ = analyze(Inputs(small.frame, [], jobs))
    return data


# -- 2. memory and thermal ------------------------------------------------------------------

def test_memory_thermal_finds_the_truths_findings_and_nothing_critical_elsewhere(small, result):
    got = {(m["node"], str(m["gpu"]), m["rule"]) for m in result["memory_thermal"]}
    for f in small.truth["findings"]:
        assert (f["node"], str(f["gpu"]), f["rule"]) in got
    truth_nodes = {f["node"] for f in small.truth["findings"]}
    assert all(m["node"] in truth_nodes for m in result["memory_thermal"])


def test_thermal_rule_needs_the_duration():
    t = np.arange(40) * 30.0
    temp = np.full((1, 1, 40), 60.0)
    temp[0, 0, 10:18] = 86          # 8 scrapes = 4 min: under the 5 min
    temp[0, 0, 25:36] = 86          # 11 scrapes = 5.5 min
    f = memrules.memory_thermal_findings(t, gpu_temp=temp)
    assert [(x.rule, x.episodes, x.first) for x in f] == [("gpu_temp_high", 1, t[25 + 9])]


def test_correctable_growth_threshold_is_per_24h():
    t = np.arange(2 * 2880) * 30.0
    slow = np.cumsum(np.r_[0, np.zeros(2 * 2880 - 1)])[None, None, :].copy()
    slow[..., ::720] += 1            # 4 per day: under 8
    slow = np.cumsum(slow, axis=-1)
    fast = np.zeros_like(slow)
    fast[..., ::240] += 1            # 12 per day
    fast = np.cumsum(fast, axis=-1)
    assert not memrules.memory_thermal_findings(t, corr=slow)
    assert [x.rule for x in memrules.memory_thermal_findings(t, corr=fast)] == \
        ["correctable_remap_growth"]


# -- 3. checkpoint I/O -----------------------------------------------------------------------

def test_phases_match_the_truth(small, result):
    truth = small.truth["checkpoint_phases"]
    got = result["checkpoint_phases"]
    for kind, tol in (("save", 15.0), ("load", 20.0)):
        tp = [p for p in truth if p["kind"] == kind and p["end"] - p["start"] > 30]
        short = [p for p in truth if p["kind"] == kind and p["end"] - p["start"] <= 30]
        # a save cut to under a scrape by the job's end shows, but its edges are not exact
        gp = [p for p in got if p["kind"] == kind and not any(
            abs(p["start"] - q["start"]) < 60 and abs(p["end"] - q["end"]) < 60 for q in short)]
        assert len(gp) == len(tp)
        for a, b in zip(tp, gp):
            assert abs(a["start"] - b["start"]) <= tol
            assert abs(a["end"] - b["end"]) <= tol
    io = result["checkpoint_io"]
    assert io["bottleneck"] == "rpc_slots" and "nconnect" in io["fix"]
    assert 0.1 < io["save_share_of_max"] < 0.25      # the report's 16 %


def test_bandwidth_bound_saves_are_not_called_rpc_slots():
    t = np.arange(100) * 30.0
    w = np.zeros(100)
    w[20:30] = 200e9                 # 80 % of the write maximum
    ph = ckpt_io.segment(t, w, np.zeros(100), None, np.full(100, 0.3))
    assert len(ph) == 1 and ph[0].duration == pytest.approx(300, abs=1)
    assert ckpt_io.diagnose(ph, nodes=8).bottleneck == "bandwidth"
    assert ckpt_io.diagnose([], nodes=8).bottleneck == "unknown"


# -- 4. exclusions, 5. retry chains ----------------------------------------------------------

def test_exclusions_match_the_truth(small, result):
    ex = result["exclusions"]
    counts = {}
    for e in small.truth["exclusions"]:
        counts[e["node"]] = counts.get(e["node"], 0) + 1
    top3 = sum(sorted(counts.values(), reverse=True)[:3]) / sum(counts.values())
    assert ex["total"] == len(small.truth["exclusions"])
    assert result["exclusion_top3_share"] == pytest.approx(top3)
    assert set(ex["quarantine_candidates"]) <= set(counts)


def test_retry_chains_match_the_truth(small, result):
    rc = result["retry_chains"]
    truth = small.truth["retry_chains"]
    assert rc["chains"] == len(truth)
    assert [c["attempts"] for c in rc["list"]] == [c["attempts"] for c in truth]
    assert [c["success"] for c in rc["list"]] == [c["success"] for c in truth]
    assert rc["manual_attempts"] == sum(c["manual_attempts"] for c in truth)
    iv = [x for c in truth for x in c["intervals_s"]]
    assert rc["retry_interval_s"]["median"] == pytest.approx(np.median(iv), abs=1.0)


def test_chains_without_retry_marks_use_the_gap():
    A = history.Attempt
    h = [A("1", "j", "FAILED", "1:0", 0, 7200),             # ran 2 h, then failed
         A("2", "j", "FAILED", "1:0", 7800, 8000),          # +10 min: automatic
         A("3", "j", "FAILED", "1:0", 8600, 8700),
         A("4", "j", "FAILED", "1:0", 14000, 14100),        # +88 min: a person
         A("5", "j", "RUNNING", "0:0", 16000, None)]
    (c,) = history.retry_chains(h)
    assert (len(c.attempts), c.success, len(c.manual), c.manual_success) == (2, False, 2, True)
    s = history.chain_summary([c])
    assert s["manual_success_rate"] == 0.5 and s["retry_interval_s"]["median"] == 600


# -- 6. planner numbers ----------------------------------------------------------------------

def test_young_minimises_first_order_waste_and_saxena_adds_the_restart():
    C, M = 200.0, 6 * 3600.0
    p = measured.planner_numbers(30 * 86400, 120, [600.0] * 5, [60.0], [C], gpus=504)
    assert p["mtbf_s"] == pytest.approx(M)
    taus = np.linspace(100, 20000, 20000)
    waste = C / taus + taus / (2 * M)
    assert p["young_s"] == pytest.approx(taus[np.argmin(waste)], rel=1e-3)
    assert p["daly_s"] < p["young_s"] < p["saxena_s"]
    assert p["restart_s"] == pytest.approx(660.0)
    p0 = measured.planner_numbers(86400, 0, [], [], [], gpus=8)
    assert math.isnan(p0["mtbf_s"]) and math.isnan(p0["young_s"])


def test_measured_numbers_from_the_synth(small, result):
    saves = [p["end"] - p["start"] for p in small.truth["checkpoint_phases"]
             if p["kind"] == "save" and p["end"] - p["start"] > 60]
    assert result["ckpt_save_s"] == pytest.approx(np.median(saves), rel=0.05)
    span = result["end"] - result["start"] + result["scrape_s"]
    assert result["mtbf_s"] == pytest.approx(span / len(small.truth["retry_chains"]))


def test_journal_evictions_and_quarantines_are_exclusions(tmp_path):
    from unbroken.learn.journal import read_journal_exclusions

    lines = [{"event": "ladder", "t": 10.0, "rung": "evict", "groups": [2, 3]},
             {"event": "ladder", "t": 20.0, "rung": "retry", "groups": [1]},
             {"event": "quarantine", "t": 30.0, "group": 2, "slot": 0},
             {"event": "commit", "t": 31.0, "step": 5}]
    (tmp_path / "journal.jsonl").write_text(
        "\n".join(json.dumps(x) for x in lines) + "\n{torn\n")
    ex, warnings = read_journal_exclusions(str(tmp_path))
    assert [(e.node, e.time) for e in ex] == [("group-2", 10.0), ("group-3", 10.0),
                                              ("group-2", 30.0)]
    assert len(warnings) == 1 and ":5:" in warnings[0]
    s = history.exclusion_summary(ex)
    assert s["per_node"] == {"group-2": 2, "group-3": 1} and s["top_share"] == 1.0
    with pytest.raises(ValueError, match="journal"):
        read_journal_exclusions(str(tmp_path / "missing"))
