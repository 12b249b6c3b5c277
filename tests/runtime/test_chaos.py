"""The chaos run, end to end, as a short soak: ``unbroken demo --chaos SEED --chaos-faults K``
with every fault kind at seeded steps (kill, hang, slow, stall, nan, bit flip, XID, bad code
update) on 6 real worker processes, slots failing again (the 4-group ``--chaos`` preset of
``make chaos`` runs in ``bench/chaos.py``).

Every fault must be detected and answered by the rung meant for it, every sample consumed
exactly once, and the final parameters must equal the failure-free run (every rollback here
restores a verified state and recomputes it, so the trajectory ends where it would have)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torch")

from helpers import read_journal  # noqa: E402

from unbroken.core.ettr import ettr_report  # noqa: E402

pytestmark = pytest.mark.mp

# fault kind -> how its resolution must read (the rung that answered it)
EXPECTED = {"kill": ("replan", "restart"), "hang": ("replan", "restart"),
            "slow": ("replan", "restart"), "nan": ("retry in place",),
            "update": ("rollback v",), "flip": ("replay named",),
            "xid": ("restart in place", "evict")}
SOAK = {**EXPECTED, "stall": ("replan", "restart")}


@pytest.mark.timeout(420)
def test_soak_a_slot_fails_again_and_every_fault_is_answered_exactly_once(demo, tmp_path):
    # seed 4 on 6 groups: slot 2 loses three processes (a hang, its replacement killed, the
    # next one's XID), slot 4's replacement after a kill flips bits, a stall among them
    rep = demo("--chaos", "4", "--chaos-faults", "10", "--groups", "6", "--steps", "80",
               "--out", str(tmp_path), timeout=400)
    events = read_journal(tmp_path / "journal.jsonl")
    spec = events[0]["fault_spec"]
    assert spec == ("slow:0@5,update@11,nan:4@18,flip:5@26,hang:2@31,kill:4@38,kill:2@45,"
                    "stall:1@53,xid79:2@59,flip:4@66")
    assert rep["exactly_once"] is True and rep["ledger"]["records"] == 80 * 6
    assert rep["max_abs_param_diff"] < 1e-9, spec
    fired = [e for e in events if e["event"] == "fault" and not e.get("external")]
    # every scheduled fault fired once, on the process holding its slot then
    assert sorted((e["kind"], e["group"], e.get("at")) for e in fired) == sorted(
        (f["kind"], f["group"], f["step"]) for f in events[0]["faults"])
    # no failure the machine adds: a live member left out of a generation is a false hang
    # (seen on 2026-12-04: members paused by blocking py-spy dumps, then workers held off the
    # CPU whole by autogroup scheduling, each in a session of its own); its left_out event says
    # how long its heartbeat was silent and where its main thread was
    machine = [e for e in events if e["event"] == "fault" and e.get("external")]
    assert not machine, (machine, [e for e in events if e["event"] == "left_out"])
    victims = {}
    for e in fired:
        if e["kind"] != "update":
            victims.setdefault(e["group"], []).append(e["uid"])
    assert len(set(victims[2])) == 3 and victims[2][0] == 2, victims  # three processes, slot 2
    assert victims[4][-1] != 4, victims  # slot 4's flip hit the replacement of the killed one
    lost = rep["time_lost_per_fault"]
    assert len(lost) == 10
    for f in lost:
        if f["kind"] == "nan" and f["how"].startswith("absorbed by the replan"):
            # another failure broke the NaN's step (CI, 2026-12-07, under a busy loop: the slow
            # group's eviction landed on step 18 too): the survivors recomputed it, the NaN
            # never committed and nobody saw it (core.ettr's ABSORBABLE)
            assert any(e["event"] == "replan" and e["step"] == f["step"] for e in events), f
            assert not [e for e in events if e["event"] == "incident" and
                        e["kind"] == "implicit" and e["step"] == f["step"]], f
            continue
        assert f["how"].startswith(SOAK.get(f["kind"], ("replan", "restart"))), (f, spec)
        assert f["detect_s"] is not None, (f, spec)
    # time lost: a hang waits out the heartbeat timeout, a straggler runs slow for the rounds
    # that find it, a bit flip rolls back and recomputes; none of them is free -- unless it
    # fired before an earlier fault's rollback to a step before it: that work was thrown away
    # anyway and its time is the earlier fault's (CI on 2026-12-04: the step-26 flip was found
    # late, its restore to step 20 came after the step-31 hang, and the hang cost 0.0 s)
    costly = [f for f in lost if f["kind"] in ("hang", "slow", "flip")]
    assert {f["kind"] for f in costly} == {"hang", "slow", "flip"}, (lost, spec)
    for f in costly:
        if f["lost_s"] > 0:
            continue
        undone = [g for g in lost if g["t_rel"] < f["t_rel"] and
                  g["t_rel"] + (g["detect_s"] or 0) + (g["decide_s"] or 0) > f["t_rel"] and
                  _restored_before(g["how"], f["step"])]
        # one short line per fault: pytest cuts a long repr, and this flaked 2 in 18 beside a
        # busy loop (2026-12-05) with the list cut off
        assert undone, "\n".join([f"{f['kind']}@{f['step']} charged 0 s; spec {spec}"] + [
            f"  {g['kind']}@{g['step']} t_rel {g['t_rel']:.3f} detect {g['detect_s']} decide "
            f"{g.get('decide_s')} lost {g.get('lost_s')} how {g.get('how')}" for g in lost])
    hang = next(f for f in lost if f["kind"] == "hang")
    assert hang["detect_s"] > 0.1, (hang, spec)  # the peers' heartbeat rule, never instant
    assert rep["ettr"] == pytest.approx(ettr_report(events).ettr) and rep["ettr"] < 1
    rungs = {e["rung"] for e in events if e["event"] == "ladder" and e["mode"] == "act"}
    assert {"retry", "rollback", "replay", "evict", "mask"} <= rungs
    # the NaN never reached the parameters: every committed loss is finite
    assert all(e["loss"] == e["loss"] for e in events if e["event"] == "commit")


def _restored_before(how: str, step: int) -> bool:
    """A fault answered by restoring a step before ``step`` ("... restore @ step 20")."""
    m = re.search(r"(?:restore|restart from \w+) @ step (\d+)", how)
    return m is not None and int(m.group(1)) < step
