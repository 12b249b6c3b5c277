"""ETTR accounting on synthetic journals whose intervals are known exactly."""

import pytest

from helpers import DATA, read_journal
from helpers import commit_lines as commits  # every live group journals a commit, 3 ms apart

from unbroken.core.ettr import ettr_report, timeline

T0 = 1000.0


def journal(steps=100, dt=0.1, fault_step=None, kind="kill", group=1, extra=1.0):
    """A masked failure at ``fault_step`` making that step's interval ``extra`` s longer."""
    ev = [{"event": "start", "t": T0 - 5.0, "src": "driver",
           "config": {"groups": 4, "redundancy": 2, "steps": steps}}]
    members, t = [0, 1, 2, 3], T0
    for k in range(steps):
        if k == fault_step:
            tf = t + 0.01
            ev.append({"event": "fault", "kind": kind, "group": group, "step": k, "t": tf,
                       "src": "driver"})
            members = [m for m in members if m != group]
            for m in members:
                ev.append({"event": "replan", "step": k, "gen": 1, "members": members,
                           "phase": "fixed", "depth": 2, "patch": {"0": [group]},
                           "reason": "x", "reform_at": tf + 0.3 + 0.01 * m,
                           "t": tf + 0.5 + 0.01 * m, "src": f"group-{m}"})
            t += extra
        t += dt
        ev += commits(k, t, members, loss=5.0 - k / steps)
    ev.append({"event": "end", "wall_s": t - T0 + 5.0, "t": t + 0.5, "src": "driver"})
    return ev


def test_no_faults_gives_ettr_one():
    r = ettr_report(journal())
    assert r.step_s == pytest.approx(0.1)
    assert r.ettr == pytest.approx(1.0)
    assert r.wall_s == pytest.approx(10.0)  # origin = first commit - step_s: start-up excluded
    assert r.steps == 100 and r.faults == [] and r.restarts == 0
    assert r.losses[99] == pytest.approx(5.0 - 0.99)


def test_one_masked_fault_costing_one_second():
    r = ettr_report(journal(fault_step=50))
    assert r.step_s == pytest.approx(0.1)
    assert r.wall_s == pytest.approx(11.0)
    assert r.productive_s == pytest.approx(10.0)
    assert r.ettr == pytest.approx(10 / 11)
    (f,) = r.faults
    assert (f.kind, f.group, f.step, f.masked) == ("kill", 1, 50, True)
    assert f.lost_s == pytest.approx(1.0)
    assert f.detect_s == pytest.approx(0.3)    # earliest reform_at - fault
    assert f.decide_s == pytest.approx(0.2)    # first replan - reform start
    # commit at fault + 1.09, replan at fault + 0.5, one normal step 0.1
    assert f.recompute_s == pytest.approx(0.49)
    assert f.restart_s is None
    assert "phase fixed" in f.how and "depth 2" in f.how
    assert r.other_lost_s == pytest.approx(0.0, abs=1e-9)
    # series: one point per step; cumulative ends at the ETTR; the window dips and recovers
    assert len(r.series) == 100
    assert r.series[-1][1] == pytest.approx(r.ettr)
    assert min(w for _, _, w in r.series) < 0.7 and r.series[-1][2] == pytest.approx(1.0)


def test_degraded_steps_after_masking_are_lost_but_not_in_the_fault_window():
    ev = journal(fault_step=20)
    # after the failure a survivor computes two types: steps 21.. take 0.15 s instead of 0.1
    firsts = {}
    shift = 0.0
    for e in sorted((e for e in ev if e["event"] == "commit"), key=lambda e: e["t"]):
        if e["step"] > 20 and e["step"] not in firsts:
            shift += 0.05
            firsts[e["step"]] = shift
        if e["step"] > 20:
            e["t"] += firsts[e["step"]]
    r = ettr_report(ev)
    assert r.step_s == pytest.approx(0.1)  # the pre-failure baseline, not the slower median
    assert r.faults[0].lost_s == pytest.approx(1.0)
    assert r.other_lost_s == pytest.approx(79 * 0.05)
    assert r.ettr == pytest.approx(10 / (11 + 79 * 0.05))


def test_warm_up_steps_before_an_early_failure_do_not_set_the_baseline():
    # the first 4 intervals warm up (0.2 s), then a masked fault at step 5 costing 1 s, then
    # 0.1 s steps: the baseline is the steady step, so the fault and the warm-up cost time
    ev = journal(steps=30, fault_step=5)
    for e in ev:
        if e["event"] == "commit":
            e["t"] += 0.1 * min(e["step"], 4)
        elif e["event"] in ("fault", "replan", "end"):
            e["t"] += 0.4
    r = ettr_report(ev)
    assert r.step_s == pytest.approx(0.1)
    assert r.faults[0].lost_s == pytest.approx(1.0) and r.ettr < 1
    assert r.ettr == pytest.approx(3.0 / (3.0 + 1.0 + 0.4))


def test_hang_detected_only_by_heartbeat_is_masked():
    ev = journal(fault_step=60, kind="hang", group=3, extra=2.0)
    tf = next(e["t"] for e in ev if e["event"] == "fault")
    ev.append({"event": "detected", "group": 3, "how": "heartbeat", "t": tf + 1.2,
               "src": "driver"})
    r = ettr_report(ev)
    (f,) = r.faults
    assert f.masked and f.kind == "hang" and f.lost_s == pytest.approx(2.0)
    assert r.ettr == pytest.approx(10 / 12)


def test_two_faults_resolved_by_one_replan_are_not_counted_twice():
    ev = journal(fault_step=50)
    tf = next(e["t"] for e in ev if e["event"] == "fault")
    ev.append({"event": "fault", "kind": "kill", "group": 2, "step": 50, "t": tf + 0.001})
    for e in ev:
        if e["event"] in ("replan", "commit") and e["step"] >= 50:
            e["members"] = [0, 3]
    ev = [e for e in ev if not (e["event"] == "commit" and e["src"] == "group-2"
                               and e["step"] >= 50)]
    r = ettr_report(ev)
    assert [f.group for f in r.faults] == [1, 2]
    assert all(f.masked for f in r.faults)
    assert sum(f.lost_s for f in r.faults) == pytest.approx(1.0)


def wipeout_journal():
    """Kill at step 60 wipes out; restart from the snapshot of step 55, ready 2 s later."""
    ev, t, members = [], T0, [0, 1, 2, 3]
    for k in range(60):
        t += 0.1
        ev += commits(k, t, members)
    tf = t + 0.01
    ev.append({"event": "fault", "kind": "kill", "group": 2, "step": 60, "t": tf})
    ev.append({"event": "detected", "group": 2, "how": "exit", "t": tf + 0.2})
    for m in (0, 1):
        ev.append({"event": "wipeout", "step": 60, "members": [0, 1], "lost_types": [2],
                   "reason": "no copy", "t": tf + 0.3})
    ready = tf + 2.0
    ev.append({"event": "restart", "step": 55, "reason": "wipe-out", "source": "memory",
               "t_ready": ready, "t": tf + 0.5})
    t = ready
    for k in range(55, 100):
        t += 0.1
        ev += commits(k, t, [0, 1, 4, 5])
    return ev


def test_wipeout_restart_is_not_masked_and_redone_steps_are_lost():
    ev = wipeout_journal()
    tl = timeline(ev)
    assert [k for _, k, new in tl if not new] == [55, 56, 57, 58, 59]
    r = ettr_report(ev)
    assert r.restarts == 1 and r.steps == 100
    (f,) = r.faults
    assert not f.masked and "memory" in f.how
    # (commit 59 -> ready + 0.1) is redone step 55, then 56..59 redone, 60 on time
    assert f.lost_s == pytest.approx(2.11 + 0.4)
    assert f.detect_s == pytest.approx(0.2)  # the driver saw the exit first
    assert f.decide_s == pytest.approx(0.1)
    assert f.restart_s == pytest.approx(1.7)
    assert f.recompute_s == pytest.approx(0.5)  # 6 steps from ready to step 60, less one
    assert r.ettr == pytest.approx(10 / (10 + 2.51))


def test_robust_to_junk_unknown_events_and_a_slow_first_step():
    ev = journal()
    ev[1]["t"] -= 0.5  # first commit late relative to the second: warm-up
    ev += [{"event": "mystery", "t": T0 + 3}, {"event": "commit"}, {"t": "x"}, "garbage",
           {"event": "commit", "step": "7", "t": T0}]
    r = ettr_report(ev)
    assert r.step_s == pytest.approx(0.1)
    # the junk is ignored (100 steps, not 101); the 0.5 s of the slow first step are lost
    assert r.steps == 100 and r.ettr == pytest.approx(10 / 10.5)
    empty = ettr_report([])
    assert empty.ettr == 1.0 and empty.series == [] and empty.wall_s == 0.0


def test_restart_line_written_late_still_separates_the_epochs():
    ev = wipeout_journal()
    restart = next(e for e in ev if e["event"] == "restart")
    restart["t"] = restart["t_ready"] + 0.35  # after the replacements' first commits
    r = ettr_report(ev)
    assert [k for _, k, new in timeline(ev) if not new] == [55, 56, 57, 58, 59]
    assert r.faults[0].lost_s == pytest.approx(2.51)
    assert r.ettr == pytest.approx(10 / 12.51)


# issue 9: `demo --chaos 11`, its journal trimmed to the first commit of steps 12..52 and the lines
# the accounting reads. A slow group 1 from step 22 is masked at step 44 (fail-slow); a bit flip
# on group 3 at step 40 is found by step 49's SDC check and answered by the guard: replay, evict,
# restore checkpoint 40. The guard's restart, the first restart after the slow fault, used to be
# booked there ("restart from checkpoint @ step 40") and the flip charged nothing.
CHAOS11 = DATA / "chaos11_trimmed.jsonl"


def chaos11(incident_field: bool) -> list[dict]:
    """The journal as written (the restart line names no incident) or as the guard now writes
    it (``incident``: the fault kind it answers)."""
    ev = read_journal(CHAOS11)
    if incident_field:
        next(e for e in ev if e["event"] == "restart")["incident"] = "sdc"
    return ev


@pytest.mark.parametrize("incident_field", [False, True])
def test_chaos11_each_fault_gets_its_own_outcome(incident_field):
    r = ettr_report(chaos11(incident_field))
    slow, flip = r.faults
    assert (slow.kind, slow.group, slow.step) == ("slow", 1, 22)
    assert (flip.kind, flip.group, flip.step) == ("flip", 3, 40)
    # the slow group is masked by the replan without it (step 44), not by the guard's restore
    assert slow.masked and slow.how == "replan (phase free, depth 2)"
    assert slow.restart_s is None
    assert slow.detect_s == pytest.approx(1796111680.7985363 - 1796111675.8456275)
    assert slow.recompute_s == pytest.approx(0.0)  # step 44 committed 0.04 s after the replan
    # the restore is the flip's: its cost is the roll-back, from the last commit before the
    # restore (step 48) to the first new step after it (49), less that step's normal time
    assert not flip.masked and flip.how == "replay named [3]: evict, restore @ step 40"
    assert flip.restart_s == 0.0
    t21, t48, t49 = 1796111675.7575538, 1796111679.4471056, 1796111681.4083185
    assert flip.lost_s == pytest.approx(t49 - t48 - r.step_s)
    # the slow group's: its slow steps 22..48 before the roll-back; together the two windows,
    # each interval charged once
    assert slow.lost_s == pytest.approx(t48 - t21 - 27 * r.step_s)
    assert slow.lost_s + flip.lost_s == pytest.approx(t49 - t21 - 28 * r.step_s)


def test_a_replan_is_charged_to_the_fault_it_masks_not_to_an_earlier_open_one():
    # a slow group 3 from step 10, masked at step 70; a kill of group 1 at step 50 inside its
    # window is masked by its own replan at once: that second is the kill's
    ev = journal(fault_step=50)
    t10 = next(e["t"] for e in ev if e["event"] == "commit" and e["step"] == 10)
    t70 = next(e["t"] for e in ev if e["event"] == "commit" and e["step"] == 70)
    ev.append({"event": "fault", "kind": "slow", "group": 3, "step": 10, "t": t10 + 0.01})
    ev.append({"event": "replan", "step": 70, "gen": 2, "members": [0, 2], "phase": "fixed",
               "depth": 2, "reason": "x", "reform_at": t70 + 0.01, "t": t70 + 0.02})
    r = ettr_report(ev)
    kill, slow = sorted(r.faults, key=lambda f: f.kind)
    assert kill.masked and slow.masked and "replan" in slow.how
    assert kill.lost_s == pytest.approx(1.0)
    assert slow.lost_s == pytest.approx(0.0, abs=1e-9)


def test_a_failure_noticed_after_the_survivors_masked_it_is_masked_not_unresolved():
    """A remote node's loss: the survivors' heartbeat rule re-forms without group 1 before the
    supervisor (by the node's own silence) journals the fault. It is still the replan's fault:
    masked, the step's extra second charged to it, dated no later than the reform."""
    ev = journal(fault_step=50, kind="hang")
    fault = next(e for e in ev if e["event"] == "fault")
    last_replan = max(e["t"] for e in ev if e["event"] == "replan")
    fault.update(external=True, uid=1, t=last_replan + 0.7)
    (f,) = ettr_report(ev).faults
    assert f.masked and f.how.startswith("replan") and f.rung == "mask"
    assert f.lost_s == pytest.approx(1.0)
    assert f.detect_s == pytest.approx(0.0)    # dated at the first reform
    assert f.decide_s == pytest.approx(0.2)
    fault.pop("external")                      # an injected fault is dated by its injector:
    (f,) = ettr_report(ev).faults              # nothing after it answers it
    assert not f.masked and f.how == "unresolved"


def test_a_straggler_replaced_in_an_admission_is_answered_there_not_by_a_later_replan():
    # slow group 3 from step 10; the guard evicts it and its spare (uid 4) is admitted at step
    # 30: that re-form leaves 3 out and answers it. The kill of group 1 at step 50 re-plans
    # without 3 too, and must not be taken for the straggler's answer (the soak, 2026-12-04:
    # a straggler "answered" by a later hang's replan swallowed that hang's time)
    ev = journal(fault_step=50)
    for e in ev:
        if e["event"] == "replan":
            e["members"] = [0, 2, 4]
    t10 = next(e["t"] for e in ev if e["event"] == "commit" and e["step"] == 10)
    t30 = next(e["t"] for e in ev if e["event"] == "commit" and e["step"] == 30)
    ev.append({"event": "fault", "kind": "slow", "group": 3, "step": 10, "t": t10 + 0.01})
    for m in (0, 1, 2, 4):
        ev.append({"event": "admit", "step": 30, "gen": 1, "members": [0, 1, 2, 4],
                   "joined": {"4": 3}, "source": "snapshot", "reform_at": t30 + 0.01,
                   "t": t30 + 0.02 + 0.001 * m, "src": f"group-{m}"})
    r = ettr_report(ev)
    kill, slow = sorted(r.faults, key=lambda f: f.kind)
    assert slow.masked and slow.how.startswith("replan at an admission"), slow
    assert slow.detect_s == pytest.approx(t30 - t10, abs=1e-6)
    assert kill.lost_s == pytest.approx(1.0)



@pytest.mark.parametrize("slow_answer", ["replan before", "wipe-out after"])
def test_a_restore_and_its_redone_steps_are_the_flips_whatever_answers_the_slow_group_beside(
        slow_answer):
    # the soak beside a busy loop (issue 28): a slow group 0 from step 10, a bit flip on group
    # 5 from step 26 that step 29's SDC check finds; the guard restores checkpoint 20. The
    # slow group is answered in the same interval (no commit between):
    # - "replan before": masked by a replan at step 29, before step 29 committed. Its window
    #   ran to its next new step, 29, committed only after steps 20..28 were redone; answered
    #   first, it took the restore and the redone steps and the flip was charged 0 s (1 in 14
    #   runs);
    # - "wipe-out after": evicted while the members restore; with the flip's group gone too a
    #   type has no host left, a wipe-out, a restart from memory at the same step 20, a
    #   roll-back answered after the flip's (3 in 30 runs of a first fix, latest roll-back
    #   first, charged the flip 0 s)
    ev = [{"event": "start", "t": T0 - 5.0, "src": "driver",
           "config": {"groups": 6, "redundancy": 2, "steps": 40}}]
    every, t = [0, 1, 2, 3, 4, 5], T0
    for k in range(29):
        t += 0.15 if k > 10 else 0.1  # group 0 slows every step from 11 on
        ev += commits(k, t, every)
        if k == 10:
            ev.append({"event": "fault", "kind": "slow", "group": 0, "uid": 0, "step": 10,
                       "at": 10, "t": t - 0.05, "src": "group-0"})
        if k == 25:
            ev.append({"event": "fault", "kind": "flip", "group": 5, "uid": 5, "step": 26,
                       "at": 26, "t": t + 0.01, "src": "group-5"})
    t28, live = t, [1, 2, 3, 4, 5]
    if slow_answer == "replan before":
        for m in live:
            ev.append({"event": "replan", "step": 29, "gen": 1, "members": live,
                       "phase": "free", "depth": 2, "reason": "x", "reform_at": t28 + 0.1,
                       "t": t28 + 0.2 + 0.001 * m, "src": f"group-{m}"})
    ev.append({"event": "incident", "kind": "sdc", "step": 29, "n": 2, "t": t28 + 0.3})
    restore = t28 + 0.5
    ev.append({"event": "restart", "step": 20, "source": "checkpoint", "incident": "sdc",
               "reason": "sdc: roll back to step 20", "t": restore, "t_ready": restore,
               "src": "driver"})
    ev.append({"event": "resolved", "incident": "sdc", "detected_t": t28 + 0.3,
               "how": "replay named [5]: evict, restore @ step 20", "step": 20, "restart": True,
               "t": restore, "src": "driver"})
    if slow_answer == "wipe-out after":
        for m in (1, 2, 3, 4):
            ev.append({"event": "wipeout", "step": 20, "gen": 1, "members": [1, 2, 3, 4],
                       "lost_types": [0], "reason": "x", "t": restore + 0.2 + 0.001 * m,
                       "src": f"group-{m}"})
        ev.append({"event": "restart", "step": 20, "source": "memory", "reason": "wipe-out",
                   "t": restore + 0.2, "t_ready": restore + 0.3, "src": "driver"})
    t = restore + 0.4
    for k in range(20, 40):
        t += 0.1
        ev += commits(k, t, [1, 2, 3, 4, 6, 7])
        if k == 29:
            t29 = t
    r = ettr_report(ev)
    slow, flip = r.faults
    assert r.step_s == pytest.approx(0.1)
    assert slow.how == ("replan (phase free, depth 2)" if slow_answer == "replan before"
                        else "restart from memory @ step 20")
    assert not flip.masked and flip.how.startswith("replay named [5]")
    # the slow steps 11..28 are the slow group's; from the last commit before the restore
    # (step 28) to the first new step after it (29) is the flip's: the restore, the redone
    # steps 20..28 and step 29 beyond its normal time
    assert slow.lost_s == pytest.approx(18 * 0.05)
    assert flip.lost_s == pytest.approx(t29 - t28 - 0.1)
    assert r.other_lost_s == pytest.approx(0.0, abs=1e-9)


def test_a_nan_whose_step_another_failure_replanned_is_absorbed_not_unresolved():
    """A NaN injected into step 50's gradient of group 2 while group 1's death broke that
    step's op: the survivors' replan recomputed step 50, no member ever saw the NaN (no
    incident). The NaN is masked, "absorbed" by that replan, and charged nothing: the second
    the step lost is the kill's. Without the replan (or with the incident) it is not."""
    ev = journal(fault_step=50)
    tf = next(e["t"] for e in ev if e["event"] == "fault")
    ev.append({"event": "fault", "kind": "nan", "group": 2, "uid": 2, "step": 50,
               "t": tf + 0.001, "src": "group-2"})
    ev.sort(key=lambda e: e["t"])
    r = ettr_report(ev)
    kill, nan = sorted(r.faults, key=lambda f: f.kind)
    assert nan.kind == "nan" and nan.masked and nan.how.startswith("absorbed by the replan")
    assert nan.lost_s == pytest.approx(0.0) and kill.lost_s == pytest.approx(1.0)
    # the NaN found at step 50 (an incident): the guard answers it, not the replan
    seen = ev + [{"event": "incident", "kind": "implicit", "step": 50, "t": tf + 0.002,
                  "src": "group-0"}]
    (nan,) = [f for f in ettr_report(sorted(seen, key=lambda e: e["t"])).faults
              if f.kind == "nan"]
    assert nan.how == "unresolved" and not nan.masked
    # no replan of that step: nothing recomputed it
    alone = [e for e in ev if e["event"] != "replan"]
    (nan,) = [f for f in ettr_report(alone).faults if f.kind == "nan"]
    assert nan.how == "unresolved" and not nan.masked
