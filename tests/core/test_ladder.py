"""The recovery ladder: pure decisions, driven through decide/advance like a runtime would."""

import pytest

from unbroken.core.ladder import (
    EXIT_NO_PROGRESS,
    Committed,
    Fault,
    Replayed,
    LadderError,
    LadderPolicy,
    LadderState,
    Rung,
    Tried,
    advance,
    decide,
    held,
    quarantined,
    queue_update,
    update_due,
)

POLICY = LadderPolicy()


def climb(fault, state, policy=POLICY, now=0.0, dt=10.0, limit=30):
    """Decide, fail, decide... until the ladder gives up; the rungs visited in order."""
    seen = []
    for _ in range(limit):
        d, reason = decide(fault, state, policy, now)
        assert reason
        seen.append(d.rung)
        if d.rung is None:
            return seen, d, reason
        state = advance(state, Tried(d, ok=True), policy)
        now += dt
    raise AssertionError(f"ladder never gave up: {seen}")


def test_rungs_are_in_ladder_order_cheapest_first():
    assert [r.name for r in Rung] == ["MASK", "EVICT", "RETRY", "ROLLBACK", "REPLAY", "RESTART",
                                      "REQUEUE"]
    assert sorted(Rung) == list(Rung)


def test_maskable_death_is_masked():
    d, reason = decide(Fault("death", (3,), maskable=True), LadderState(), POLICY, 5.0, standby=2)
    assert d.rung is Rung.MASK and d.groups == (3,) and d.version is None
    assert not d.restarts
    assert "mask" in reason


def test_unmaskable_death_with_standby_evicts_and_replaces():
    d, _ = decide(Fault("death", (1, 2)), LadderState(), POLICY, 0.0, standby=2)
    assert d.rung is Rung.EVICT and d.groups == (1, 2) and d.replace == 2 and not d.mask
    state = advance(LadderState(), Tried(d))
    assert {g: r.faults for g, r in state.exclusions.items()} == {1: (0.0,), 2: (0.0,)}
    # one standby too few for two groups: no full replacement -> not an eviction
    d, _ = decide(Fault("death", (1, 2)), LadderState(), POLICY, 0.0, standby=1)
    assert d.rung is Rung.RETRY


def test_without_standby_retry_then_rollback_of_the_applied_update():
    state = queue_update(LadderState(running="v1", last_good="v1"), "v2", now=0.0)
    fault = Fault("death", (4,))
    d, reason = decide(fault, state, POLICY, 10.0)
    assert d.rung is Rung.RETRY and d.version == "v2"  # lazy update rides on the restart
    assert "apply queued update v2" in reason
    state = advance(state, Tried(d))
    assert state.running == "v2" and state.pending is None
    d, _ = decide(fault, state, POLICY, 20.0)
    assert d.rung is Rung.RETRY  # second allowed try
    state = advance(state, Tried(d))
    d, reason = decide(fault, state, POLICY, 30.0)
    assert d.rung is Rung.ROLLBACK and d.version == "v1" and "retry used 2/2" in reason
    state = advance(state, Tried(d))
    assert state.running == "v1" and "v2" in state.rejected
    with pytest.raises(LadderError, match="v2"):
        queue_update(state, "v2", 40.0)


def test_full_climb_for_unmaskable_death_skips_what_does_not_apply():
    # nothing to roll back, a named culprit (no replay), no standby
    seen, d, reason = climb(Fault("death", (0,)), LadderState())
    assert seen == [Rung.RETRY, Rung.RETRY, Rung.RESTART, Rung.RESTART,
                    Rung.REQUEUE, Rung.REQUEUE, Rung.REQUEUE, None]
    assert d.exit_code == EXIT_NO_PROGRESS and "give up" in reason and "requeue used 3/3" in reason


def test_nan_without_culprit_retries_rolls_back_then_replays():
    state = LadderState(running="v2", last_good="v1")
    seen, _, _ = climb(Fault("implicit"), state)
    assert seen[:5] == [Rung.RETRY, Rung.RETRY, Rung.ROLLBACK, Rung.REPLAY, Rung.RESTART]
    assert seen == sorted(seen[:-1]) + [None]  # never climbs down within an incident


def test_attempts_exhausted_escalates_to_next_rung():
    policy = LadderPolicy(max_attempts={Rung.MASK: 1})
    fault = Fault("hang", (2,), maskable=True)
    d, _ = decide(fault, LadderState(), policy, 0.0, standby=1)
    assert d.rung is Rung.MASK
    state = advance(LadderState(), Tried(d), policy)
    d, reason = decide(fault, state, policy, 1.0, standby=1)
    assert d.rung is Rung.EVICT and "escalated past mask used 1/1" in reason
    # a zero budget skips a rung outright
    d, _ = decide(fault, LadderState(), LadderPolicy(max_attempts={"mask": 0}), 0.0, standby=1)
    assert d.rung is Rung.EVICT


def test_incident_closes_after_enough_committed_steps():
    policy = LadderPolicy(resolved_after=3, max_attempts={Rung.MASK: 1})
    fault = Fault("death", (1,), maskable=True)
    d, _ = decide(fault, LadderState(), policy, 0.0)
    state = advance(LadderState(), Tried(d), policy)
    assert state.incident_start == 0.0
    state = advance(state, Committed(2), policy)
    assert decide(fault, state, policy, 1.0)[0].rung is Rung.RETRY  # still the same incident
    state = advance(state, Committed(1), policy)
    assert state.incident_start is None and state.tries(Rung.MASK) == 0
    assert decide(fault, state, policy, 2.0)[0].rung is Rung.MASK


@pytest.mark.parametrize("action", ["reset-gpu", "reboot", "reset_gpu", "reboot_node"])
def test_xid_hardware_classes_evict_at_once(action):
    # even when masking were possible: the machine must go
    d, reason = decide(Fault("xid", (5,), maskable=True, xid_action=action),
                       LadderState(), POLICY, 0.0, standby=1)
    assert d.rung is Rung.EVICT and d.replace == 1 and "evict at once" in reason
    # no standby but the survivors can mask: evict anyway, keep training masked
    d, _ = decide(Fault("xid", (5,), maskable=True, xid_action=action), LadderState(), POLICY, 0.0)
    assert d.rung is Rung.EVICT and d.replace == 0 and d.mask


def test_xid_restart_app_retries_in_place():
    d, reason = decide(Fault("xid", (5,), maskable=True, xid_action="restart-app"),
                       LadderState(), POLICY, 0.0, standby=3)
    assert d.rung is Rung.RETRY and "restart the application" in reason
    d, _ = decide(Fault("xid", (5,), maskable=True, xid_action="investigate"),
                  LadderState(), POLICY, 0.0, standby=3)
    assert d.rung is Rung.MASK  # unknown class: the ordinary ladder


def test_sdc_mismatch_replays_and_proven_culprit_is_evicted():
    d, _ = decide(Fault("sdc", (0, 7)), LadderState(), POLICY, 0.0, standby=1)
    assert d.rung is Rung.REPLAY
    d, _ = decide(Fault("corrupt", (7,)), LadderState(), POLICY, 0.0, standby=1)
    assert d.rung is Rung.EVICT and d.groups == (7,)


def test_an_open_replay_holds_eviction_verdicts_until_answered_or_replay_hold():
    policy = LadderPolicy(replay_hold=30.0)
    d, _ = decide(Fault("sdc", (0, 7)), LadderState(), policy, 100.0, standby=1)
    assert d.rung is Rung.REPLAY
    assert held(LadderState(), policy, 100.0) == (False, "no replay is open")
    failed = advance(LadderState(), Tried(d, ok=False), policy)  # never ran: nothing to wait for
    assert not held(failed, policy, 101.0)[0]
    state = advance(LadderState(), Tried(d), policy)
    assert state.replay_since == 100.0
    on, why = held(state, policy, 129.9)
    assert on and "vote short of a majority" in why
    on, why = held(state, policy, 130.0)
    assert not on and "past the 30s hold" in why
    answered = advance(state, Replayed(), policy)
    assert answered.replay_since is None and not held(answered, policy, 101.0)[0]
    assert answered.attempts == state.attempts  # the answer closes the vote, not the incident


def test_code_error_rolls_back_only_when_the_code_changed():
    d, _ = decide(Fault("code"), LadderState(running="v3", last_good="v2"), POLICY, 0.0)
    assert d.rung is Rung.ROLLBACK and d.version == "v2"
    d, _ = decide(Fault("code"), LadderState(running="v2", last_good="v2"), POLICY, 0.0)
    assert d.rung is Rung.RETRY


def test_no_progress_guard_jumps_to_requeue_with_backoff_then_gives_up():
    policy = LadderPolicy(time_budget=100.0)
    fault = Fault("death", (1,), maskable=True)
    d, _ = decide(fault, LadderState(), policy, 0.0)
    state = advance(LadderState(), Tried(d), policy)
    d, reason = decide(fault, state, policy, 150.0)
    assert d.rung is Rung.REQUEUE and d.backoff == 600.0 and "no progress for 150s" in reason
    backoffs = []
    while d.rung is Rung.REQUEUE:
        backoffs.append(d.backoff)
        state = advance(state, Tried(d), policy)
        d, reason = decide(fault, state, policy, 200.0)
    assert backoffs == [600.0, 1200.0, 2400.0]  # exponential, under the 1 h cap
    assert d.rung is None and d.exit_code == EXIT_NO_PROGRESS == 6
    capped = LadderPolicy(max_attempts={Rung.REQUEUE: 5})
    state = LadderState(attempts={Rung.REQUEUE: 4}, incident_start=0.0)
    d, _ = decide(Fault("wipe-out", (0, 1)), state, capped, 4000.0)  # past the 1 h budget
    assert d.rung is Rung.REQUEUE and d.backoff == 3600.0  # 600 * 2**4 capped at 1 h


def test_repeat_offender_is_quarantined():
    policy = LadderPolicy(quarantine_after=2)
    state = LadderState()
    d, _ = decide(Fault("death", (9,)), state, policy, 0.0, standby=5)
    assert d.quarantine == ()
    state = advance(state, Tried(d), policy)
    state = advance(state, Committed(50), policy)  # incident over
    d, reason = decide(Fault("death", (9,)), state, policy, 10.0, standby=5)
    assert d.rung is Rung.EVICT and d.quarantine == (9,) and "quarantine [9]" in reason
    state = advance(state, Tried(d), policy)
    assert quarantined(state, policy, 10.0) == {9}
    # in quarantine, a retry sends a spare rather than restart the machine in place
    assert quarantined(state, policy, 10.0 + policy.quarantine_cooldown - 1) == {9}
    # the cool-down ends it: release is a matter of time (core.exclusion's rule)
    assert quarantined(state, policy, 10.0 + policy.quarantine_cooldown) == frozenset()


def test_evictions_further_apart_than_the_window_do_not_quarantine():
    policy = LadderPolicy(quarantine_after=2, quarantine_window=100.0)
    state = LadderState()
    for t in (0.0, 150.0):  # two evictions, 150 s apart: never two within 100 s
        d, _ = decide(Fault("death", (4,)), state, policy, t, standby=5)
        assert d.rung is Rung.EVICT and d.quarantine == ()
        state = advance(advance(state, Tried(d), policy), Committed(50), policy)
    assert quarantined(state, policy, 150.0) == frozenset()
    d, reason = decide(Fault("death", (4,)), state, policy, 200.0, standby=5)  # 50 s after the last one
    assert d.quarantine == (4,) and "quarantine [4]" in reason
    state = advance(state, Tried(d), policy)
    assert state.exclusions[4].faults == (0.0, 150.0, 200.0)
    assert quarantined(state, policy, 200.0) == {4}
    # evicted again while in quarantine: recorded, but not quarantined a second time
    state = advance(state, Committed(50), policy)
    d, reason = decide(Fault("death", (4,)), state, policy, 300.0, standby=5)
    assert d.quarantine == () and "quarantine" not in reason
    state = advance(state, Tried(d), policy)
    assert state.exclusions[4].quarantines == 1 and len(state.exclusions[4].faults) == 4


def test_an_eviction_before_the_last_one_is_booked_not_refused():
    # a wall clock that stepped back: the eviction happened, so it counts (at the last time)
    policy = LadderPolicy(quarantine_after=2)
    state = LadderState()
    d, _ = decide(Fault("death", (1,)), state, policy, 100.0, standby=5)
    state = advance(advance(state, Tried(d), policy), Committed(50), policy)
    d, _ = decide(Fault("death", (1,)), state, policy, 90.0, standby=5)
    assert d.quarantine == (1,)
    state = advance(state, Tried(d), policy)
    assert state.exclusions[1].faults == (100.0, 100.0)


def test_lazy_update_forced_after_deadline_and_promotion_to_last_good():
    policy = LadderPolicy(update_deadline=100.0, good_after=5)
    state = queue_update(LadderState(running="v1", last_good="v1"), "v2", now=0.0)
    assert update_due(state, policy, 50.0)[0] is None
    d, reason = update_due(state, policy, 100.0)
    assert d.rung is Rung.RETRY and d.version == "v2" and "deadline" in reason
    state = advance(state, Tried(d), policy)
    assert state.running == "v2" and state.incident_start is None and state.tries(Rung.RETRY) == 0
    assert state.last_good == "v1"
    state = advance(state, Committed(5), policy)
    assert state.last_good == "v2"
    # masking restarts nothing, so it never applies a queued update
    state = queue_update(state, "v3", 200.0)
    d, _ = decide(Fault("death", (0,), maskable=True), state, policy, 201.0)
    assert d.rung is Rung.MASK and d.version is None


@pytest.mark.parametrize("kwargs, match", [
    ({"max_attempts": {r: 0 for r in Rung}}, "zero attempts"),
    ({"max_attempts": {Rung.RETRY: -1}}, "RETRY"),
    ({"max_attempts": {"jump": 1}}, "jump"),
    ({"time_budget": -5.0}, "time_budget"),
    ({"update_deadline": 0}, "update_deadline"),
    ({"backoff_base": -1.0}, "backoff_base"),
    ({"backoff_base": 0.0}, "backoff_base"),
    ({"backoff_cap": 10.0}, "backoff_cap"),
    ({"time_budget": float("nan")}, "time_budget"),
    ({"resolved_after": 0}, "resolved_after"),
    ({"quarantine_window": 0.0}, "quarantine_window"),
    ({"quarantine_cooldown": float("inf")}, "quarantine_cooldown"),
])
def test_impossible_policy_is_refused_in_one_line(kwargs, match):
    with pytest.raises(LadderError, match=match) as err:
        LadderPolicy(**kwargs)
    assert "\n" not in str(err.value)


def test_bad_faults_states_and_times_are_refused():
    with pytest.raises(ValueError, match="'meltdown'"):
        Fault("meltdown")
    with pytest.raises(LadderError, match="-1"):
        Fault("death", (-1,))
    with pytest.raises(LadderError, match="action class"):
        Fault("xid", (1,))
    with pytest.raises(LadderError, match="maskable"):
        Fault("wipe-out", (1, 2), maskable=True)
    with pytest.raises(LadderError, match="standby=-1"):
        decide(Fault("hang", (1,)), LadderState(), POLICY, 0.0, standby=-1)
    with pytest.raises(LadderError, match="before the incident"):
        decide(Fault("hang", (1,)), LadderState(incident_start=10.0), POLICY, 5.0)
    with pytest.raises(LadderError, match="inf"):
        decide(Fault("hang", (1,)), LadderState(), POLICY, float("inf"))


def test_parse_policy_sets_attempts_and_fields_over_the_defaults():
    from unbroken.core.ladder import parse_policy

    p = parse_policy("retry=1, rollback=0, time_budget=600, resolved_after=3, "
                     "quarantine_after=4, quarantine_window=60")
    assert p.limit(Rung.RETRY) == 1 and p.limit(Rung.ROLLBACK) == 0
    assert p.limit(Rung.MASK) == LadderPolicy().limit(Rung.MASK)
    assert p.time_budget == 600 and p.resolved_after == 3
    assert (p.exclusion.threshold, p.exclusion.window) == (4, 60.0)


@pytest.mark.parametrize("spec, words", [
    ("retry", ["'retry'", "key=value"]),
    ("retry=lots", ["retry='lots'", "not a number"]),
    ("retry=1.5", ["retry='1.5'", "integer"]),
    ("frobnicate=1", ["unknown key 'frobnicate'"]),
    ("mask=0,evict=0,retry=0,rollback=0,replay=0,restart=0,requeue=0", ["zero attempts"]),
    ("time_budget=0", ["time_budget=0", "> 0"]),
    ("backoff_cap=1", ["backoff_cap=1", "below"]),
])
def test_parse_policy_rejects_impossible_budgets_in_one_line(spec, words):
    from unbroken.core.ladder import parse_policy

    with pytest.raises(LadderError) as ei:
        parse_policy(spec)
    assert "\n" not in str(ei.value)
    for w in words:
        assert w in str(ei.value)


def test_faults_on_other_machines_open_their_own_incident():
    policy = LadderPolicy(time_budget=100.0)
    state = LadderState()
    for g, t in ((1, 0.0), (2, 60.0), (3, 120.0)):  # three independent deaths, 1 min apart
        d, why = decide(Fault("death", (g,), maskable=True), state, policy, t)
        assert d.rung is Rung.MASK and "try 1/" in why, why  # never the budget's requeue
        state = advance(state, Tried(d), policy)
        assert state.incident_groups == frozenset({g}) and state.incident_start == t
        state = advance(state, Committed(1), policy)  # training went on between them
    # the same machine again joins its incident: the second mask, then eviction/retry
    d, why = decide(Fault("death", (3,), maskable=True), state, policy, 130.0)
    assert d.rung is Rung.MASK and "try 2/" in why
    state = advance(state, Tried(d), policy)
    d, _ = decide(Fault("death", (3,), maskable=True), state, policy, 140.0)
    assert d.rung is Rung.RETRY  # no standby to evict to, masks used up
    # a fault naming nobody joins the open incident (it may be a consequence of it)
    d, why = decide(Fault("implicit"), state, policy, 141.0)
    state2 = advance(state, Tried(d), policy)
    assert state2.incident_start == 120.0 and state2.incident_groups == frozenset({3})


def test_unmaskable_faults_with_no_step_between_them_are_one_incident():
    """A node that takes two groups (masked, each its own incident), then replacements that
    die as they start (their node is gone): no step is committed between the wipe-outs, so
    each new uid joins the incident and the ladder climbs to a restart instead of opening a
    fresh incident per replacement (seen: 4,990 respawns onto no live node in 3 minutes)."""
    policy = LadderPolicy()
    state = LadderState()
    rungs = []
    for uid, kind, t in ((0, "death", 0.0), (2, "death", 0.1), (1, "wipe-out", 0.3),
                         (3, "wipe-out", 0.31), (5, "wipe-out", 0.32)):
        d, why = decide(Fault(kind, (uid,), maskable=kind == "death"), state, policy, t)
        state = advance(state, Tried(d), policy)
        rungs.append((d.rung, why.split(":")[0]))
    assert rungs == [(Rung.MASK, "mask (try 1/2)"), (Rung.MASK, "mask (try 1/2)"),
                     (Rung.RETRY, "retry (try 1/2)"), (Rung.RETRY, "retry (try 2/2)"),
                     (Rung.RESTART, "restart (try 1/2)")], rungs
    assert state.incident_groups == frozenset({1, 2, 3, 5})
    # once a step was committed, a wipe-out on groups the incident never named is its own
    state = advance(state, Committed(1), policy)
    d, why = decide(Fault("wipe-out", (8,)), state, policy, 0.4)
    assert d.separate and "retry (try 1/2)" in why, why


def test_a_replacement_carries_its_predecessors_incident():
    from unbroken.core.ladder import Assigned

    policy = LadderPolicy()
    d, _ = decide(Fault("wipe-out", (1,)), LadderState(), policy, 0.0)
    state = advance(LadderState(), Tried(d), policy)
    state = advance(state, Committed(2), policy)  # survivors train on meanwhile
    assert advance(state, Assigned(old=7, new=9), policy) == state  # not in the incident
    state = advance(state, Assigned(old=1, new=9), policy)
    assert state.incident_groups == frozenset({1, 9})
    d, why = decide(Fault("wipe-out", (9,)), state, policy, 1.0)
    assert d.rung is Rung.RETRY and "try 2/2" in why, why  # climbs, not a new incident
    # once the incident closed, nothing carries over
    closed = advance(state, Committed(policy.resolved_after), policy)
    assert advance(closed, Assigned(old=1, new=11), policy) == closed
