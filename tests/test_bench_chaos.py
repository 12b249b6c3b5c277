"""bench/chaos.py's pure helpers on a hand-written journal (no demo run)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "chaos.py"


@pytest.fixture(scope="module")
def chaos():
    spec = importlib.util.spec_from_file_location("bench_chaos", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ev(t, event, **kw):
    return {"event": event, "t": float(t), **kw}


JOURNAL = [
    _ev(0, "start", faults=[{"kind": "update", "group": -1, "step": 5},
                            {"kind": "nan", "group": 2, "step": 8},
                            {"kind": "kill", "group": 2, "step": 10},
                            {"kind": "slow", "group": 1, "step": 12},
                            {"kind": "xid", "group": 1, "step": 14, "code": 43},
                            {"kind": "flip", "group": 0, "step": 16}]),
    _ev(1.0, "fault", kind="update", group=-1, step=5),
    _ev(1.0, "ladder", rung=None, mode="act", fault="update", **{"for": "update v1"}),
    _ev(2.0, "fault", kind="nan", group=2, uid=2, step=8),
    _ev(2.1, "ladder", rung="retry", mode="act", fault="implicit",
        **{"for": "implicit at step 8"}),
    _ev(2.1, "resolved", incident="implicit", detected_t=2.05, how="retry in place"),
    _ev(2.2, "ladder", rung="rollback", mode="act", fault="code",
        **{"for": "code at step 8"}),
    _ev(2.2, "resolved", incident="code", detected_t=2.15, how="rollback v1 -> v0"),
    _ev(3.0, "fault", kind="kill", group=2, uid=2, step=10),
    _ev(3.1, "detected", group=2, slot=2, how="exit"),
    _ev(3.2, "replan", members=[0, 1, 3], step=10, gen=1, reform_at=3.1),
    _ev(4.0, "fault", kind="slow", group=1, uid=1, step=12),
    _ev(5.0, "fault", kind="xid", group=1, uid=1, step=14, code=43),
    # an XID decision inside the slow fault's window must not count as the slow's rung
    _ev(5.0, "ladder", rung="retry", mode="act", groups=[1], fault="xid",
        **{"for": "xid 43"}),
    _ev(5.0, "resolved", incident="xid", detected_t=5.0, how="restart in place group 1"),
    _ev(5.1, "detected", group=1, slot=1, how="xid"),
    _ev(5.3, "replan", members=[0, 3, 4], step=14, gen=2, reform_at=5.2),
    _ev(6.0, "fault", kind="flip", group=0, uid=0, step=16),
    _ev(6.5, "ladder", rung="replay", mode="act", fault="sdc",
        **{"for": "sdc at step 19"}),
    _ev(6.6, "ladder", rung="evict", mode="act", groups=[0], fault="corrupt",
        **{"for": "corrupt [0]"}),
    _ev(6.6, "resolved", incident="sdc", detected_t=6.5, how="replay named [0]: evict",
        restart=True),
    _ev(6.7, "detected", group=0, slot=0, how="replay"),
]

COSTS = [
    {"kind": "update", "group": -1, "step": 5, "how": "rollback v1 -> v0", "detect_s": 1.15,
     "lost_s": 0.1, "masked": True},
    {"kind": "nan", "group": 2, "step": 8, "how": "retry in place", "detect_s": 0.05,
     "lost_s": 0.0, "masked": True},
    {"kind": "kill", "group": 2, "step": 10, "how": "replan (phase free, depth 2)", "rung": "mask",
     "detect_s": 0.1, "lost_s": 0.2, "masked": True},
    {"kind": "slow", "group": 1, "step": 12, "how": "replan (phase free, depth 2)", "rung": "mask",
     "detect_s": 1.2, "lost_s": 1.0, "masked": True},
    {"kind": "xid", "group": 1, "step": 14, "how": "restart in place group 1", "detect_s": 0.0,
     "lost_s": 0.0, "masked": True},
    {"kind": "flip", "group": 0, "step": 16, "how": "replay named [0]: evict",
     "detect_s": 0.5, "lost_s": 2.0, "masked": False},
]


def test_classify_rungs_per_fault(chaos):
    got = {f["kind"]: f for f in chaos.classify(JOURNAL, COSTS)}
    assert got["update"]["rungs"] == ["rollback"]
    assert got["nan"]["rungs"] == ["retry"]
    assert (got["kill"]["rungs"], got["kill"]["rung_from"]) == (["mask"], "how")
    assert got["kill"]["removed_by"] == "exit"
    # the straggler was taken out by the XID's restart, not by a fail-slow decision
    assert (got["slow"]["rungs"], got["slow"]["removed_by"]) == (["mask"], "xid")
    assert got["xid"]["rungs"] == ["retry"]
    assert got["flip"]["rungs"] == ["replay", "evict"]
    assert got["flip"]["removed_by"] == "replay"
    assert got["flip"]["lost_s"] == 2.0 and got["flip"]["masked"] is False
    assert all(f["resolved"] for f in got.values())


def test_handled_flags_missing_and_unresolved(chaos):
    assert chaos.handled(JOURNAL, COSTS) == (True, [])
    no_flip = [e for e in JOURNAL if not (e["event"] == "fault" and e["kind"] == "flip")]
    ok, problems = chaos.handled(no_flip, COSTS)
    assert not ok and problems == ["flip:0@16: no fault event"]
    costs = [{**c, "how": "unresolved"} if c["kind"] == "kill" else c for c in COSTS]
    ok, problems = chaos.handled(JOURNAL, costs)
    assert not ok and problems == ["kill:2@10: how 'unresolved'"]


def test_nonfinite_numbers_become_strings(chaos):
    out = chaos.finite({"a": float("nan"), "b": [float("inf"), 1.5], "c": None})
    assert out == {"a": "nan", "b": ["inf", 1.5], "c": None}
    json.dumps(out, allow_nan=False)


def test_compare_ratio_or_which_is_nan(chaos):
    act = [{"seed": 0, "max_abs_param_diff": 1e-12}, {"seed": 1, "max_abs_param_diff": 2e-12}]
    base = [{"seed": 0, "max_abs_param_diff": 1e-3, "params_finite": True, "finished": True},
            {"seed": 1, "max_abs_param_diff": float("nan"), "params_finite": False,
             "finished": True}]
    c = chaos.compare(act, base)
    assert c["per_seed"][0]["baseline_over_act"] == pytest.approx(1e9)
    assert c["per_seed"][1]["note"] == "baseline is nan"
    assert c["baseline_nonfinite_params"] == 1


def test_rungs_come_from_the_ladder_inputs_kind_not_its_text(chaos):
    # the kill's own death decision (the mask rung) answers it; a decision whose text looks
    # related but whose input is another kind does not
    j = JOURNAL + [
        _ev(3.15, "ladder", rung="mask", mode="act", groups=[2], fault="death",
            **{"for": "death group 2"}),
        _ev(3.16, "ladder", rung="evict", mode="act", groups=[3], fault="fail-slow",
            **{"for": "stall of [2]"}),
    ]
    got = {f["kind"]: f for f in chaos.classify(sorted(j, key=lambda e: e["t"]), COSTS)}
    assert (got["kill"]["rungs"], got["kill"]["rung_from"]) == (["mask"], "ladder")
