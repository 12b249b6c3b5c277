"""Pure liveness rules behind the fault-tolerant communicator (no processes, no clock)."""

import math

import pytest

from unbroken.core.membership import (
    beat_clock,
    live_members,
    next_members,
    observe,
    rendezvous_ready,
    silent_members,
    stale_members,
)


def test_stale_members_strictly_older_than_staleness():
    hb = {0: 10.0, 1: 9.0, 2: 8.9, 3: 10.5}
    assert stale_members(hb, now=10.0, staleness=1.0) == [2]  # 1 is exactly 1.0 old: not stale
    assert stale_members(hb, now=20.0, staleness=1.0) == [0, 1, 2, 3]
    assert stale_members({}, now=5.0, staleness=1.0) == []


def test_stale_members_rejects_nonpositive_staleness():
    with pytest.raises(ValueError):
        stale_members({0: 1.0}, now=1.0, staleness=0)


def test_observe_records_time_of_last_change_only():
    obs = observe({}, {0: 1, 1: 1}, now=1.0, beats=4.0)
    assert obs == {0: (1, 1.0, 4.0), 1: (1, 1.0, 4.0)}
    obs = observe(obs, {0: 2, 1: 1}, now=1.5, beats=5.0)  # 0 moved, 1 did not
    assert obs == {0: (2, 1.5, 5.0), 1: (1, 1.0, 4.0)}
    obs = observe(obs, {0: 2}, now=3.0, beats=9.0)  # absent peers keep their entry
    assert obs == {0: (2, 1.5, 5.0), 1: (1, 1.0, 4.0)}


def test_live_members_uses_observer_clock_not_peer_clock():
    obs = {0: (5, 100.0, 0.0), 1: (7, 99.5, 0.0), 2: (3, 98.0, 0.0)}
    assert live_members([0, 1, 2], obs, now=100.2, staleness=1.0) == [0, 1]


def test_never_started_member_is_not_stale_and_order_is_kept():
    obs = {3: (0, 0.0, 0.0), 1: (4, 50.0, 0.0)}
    assert live_members([3, 1, 2], obs, now=100.0, staleness=1.0) == [3, 2]


def test_declared_dead_is_dropped_even_with_fresh_heartbeat():
    obs = {0: (9, 10.0, 0.0), 1: (9, 10.0, 0.0)}
    assert live_members([0, 1], obs, now=10.1, staleness=1.0, dead=[1]) == [0]


def test_beat_clock_is_the_high_median_of_started_members_increases():
    prev = {1: (10, 0.0, 0.0), 2: (10, 0.0, 0.0), 3: (10, 0.0, 0.0), 4: (0, 0.0, 0.0)}
    # 3 stopped (no increase), 4 not started (no vote), 5 new (no vote): own 1, 1 and 2 beat
    assert beat_clock(prev, {1: 11, 2: 12, 3: 10, 4: 0, 5: 7}) == 1.0
    # the observer and one stopped peer: the high median still moves
    assert beat_clock({1: (10, 0.0, 0.0)}, {1: 10}) == 1.0
    # a starved machine: the peers made no beat while the observer slept
    assert beat_clock(prev, {1: 10, 2: 10, 3: 10}) == 0.0
    # the observer was starved itself: the peers beat three times meanwhile
    assert beat_clock(prev, {1: 13, 2: 13, 3: 10}) == 3.0


def test_silence_is_judged_by_the_peers_beats_not_wall_time_alone():
    # member 2 silent since t=10 (clock 100); the others beat on
    obs = {1: (50, 10.4, 104.0), 2: (30, 10.0, 100.0)}
    judge = dict(staleness=0.3, min_beats=3, ceiling=0.9)
    assert silent_members(obs, now=10.35, beats=104.0, **judge) == [2]
    # the same wall-time silence on a starved machine (2 beats by the others): not yet
    assert silent_members(obs, now=10.35, beats=102.0, **judge) == []
    # not long enough in wall time, however many beats
    assert silent_members(obs, now=10.25, beats=110.0, **judge) == []
    # past the ceiling the clock is not asked (most members silent at once)
    assert silent_members(obs, now=10.95, beats=100.0, **judge) == [2]
    assert live_members([1, 2], obs, now=10.35, staleness=0.3, beats=104.0, min_beats=3,
                        ceiling=0.9) == [1]
    assert live_members([1, 2], obs, now=10.35, staleness=0.3, beats=101.0, min_beats=3,
                        ceiling=0.9) == [1, 2]


def test_a_starved_observer_restarts_every_observation_and_judges_nobody_on_its_sleep():
    from unbroken.core.membership import starved_observer

    # peer 2 went quiet at t=10; the observer's thread read at t=10.2, then slept until 11.0
    obs = {1: (50, 10.2, 104.0), 2: (30, 10.0, 100.0)}
    fresh, why = starved_observer(obs, last_read=10.2, now=11.0, staleness=0.3, beats=104.0)
    assert why is not None and "starved" in why
    assert fresh == {1: (50, 11.0, 104.0), 2: (30, 11.0, 104.0)}  # counters kept
    judge = dict(staleness=0.3, min_beats=3, ceiling=0.9)
    assert silent_members(obs, now=11.0, beats=104.0, **judge) == [2]  # judged on its sleep
    assert silent_members(fresh, now=11.0, beats=104.0, **judge) == []
    # the silence it does watch after waking still counts: 2 stays quiet, 1 beats on
    later = observe(fresh, {1: 60, 2: 30}, now=11.35, beats=107.0)
    assert silent_members(later, now=11.35, beats=107.0, **judge) == [2]
    # reads less than staleness/2 apart: the observer watched, nothing changes
    same, why = starved_observer(obs, last_read=10.9, now=11.0, staleness=0.3, beats=104.0)
    assert same == obs and why is None
    with pytest.raises(ValueError):
        starved_observer(obs, last_read=10.0, now=11.0, staleness=0)


def test_silence_rule_fits_the_beats_in_the_staleness():
    from unbroken.core.membership import silence_rule

    assert silence_rule(0.3, 0.1) == (3, pytest.approx(0.9))  # 0.3 / 0.1 is 2.999... in floats
    assert silence_rule(5.0, 0.1) == (50, 15.0)


def test_rendezvous_ready_and_next_members():
    assert not rendezvous_ready(joined=[3, 0], live=[0, 1, 3])
    assert rendezvous_ready(joined=[3, 0, 1], live=[0, 1, 3])
    assert rendezvous_ready(joined=[3, 0, 1], live=[0, 3])  # extra joiners are fine
    assert next_members([3, 0, 1, 3]) == [0, 1, 3]


def test_rendezvous_waits_for_every_expected_joiner_registered_or_dead():
    live, joined = [0, 1], [0, 1]
    assert not rendezvous_ready(joined, live, expected=[5, 6], accounted=[5])
    assert rendezvous_ready(joined, live, expected=[5, 6], accounted=[5, 6])  # 6: dead
    assert rendezvous_ready(joined, live, expected=[], accounted=[])
    assert not rendezvous_ready([0], live, expected=[5], accounted=[5])  # 1 still missing


def test_generation_reports_are_all_or_nothing():
    from unbroken.core.membership import generation_reports

    reports = {0: "a", 1: "b", 7: "joiner"}
    assert generation_reports([0, 1, 7], reports) == {0: "a", 1: "b", 7: "joiner"}
    assert generation_reports([0, 1], reports) == {0: "a", 1: "b"}  # only the members'
    assert generation_reports([0, 1, 2], reports) is None  # 2 offered nothing
    assert generation_reports([], {}) == {}


def test_rendezvous_waits_a_few_beats_only_when_a_peer_process_is_known_gone():
    from unbroken.core.membership import rendezvous_staleness

    assert rendezvous_staleness(1.0, 0.1, peer_died=False) == 1.0
    assert rendezvous_staleness(1.0, 0.1, peer_died=True) == pytest.approx(0.3)
    # never longer than the ordinary staleness
    assert rendezvous_staleness(0.2, 0.1, peer_died=True) == 0.2


def test_left_behind_is_every_earlier_member_the_new_generation_lacks():
    from unbroken.core.membership import left_behind

    gen0 = {0: 0, 1: 0, 2: 0, 3: 0}
    assert left_behind(gen0, 1, [0, 1, 3]) == [2]
    assert left_behind({0: 0, 1: 0}, 1, [0, 1, 4]) == []  # a joiner is not a holder left behind
    assert left_behind({3: 0, 1: 0, 2: 0}, 1, []) == [1, 2, 3]
    # spare 4 admitted in gen 2; a survivor's line about gen 1 read after that: not left behind
    assert left_behind({0: 0, 2: 0, 3: 0, 4: 2}, 1, [0, 2, 3]) == []
    # ... but a later generation without it does leave it behind
    assert left_behind({0: 0, 2: 0, 3: 0, 4: 2}, 3, [0, 2, 3]) == [4]
    # a line without its generation (an older journal's wipe-out) judges every holder
    assert left_behind({0: 0, 4: 2}, math.inf, [0]) == [4]


def test_wipeout_cover_takes_the_shortest_prefix_with_live_joiners_for_every_dead_slot():
    from unbroken.core.membership import wipeout_cover

    assert wipeout_cover([], []) == 0
    assert wipeout_cover([(1, False)], [1, 2]) is None  # slot 2 still uncovered: keep waiting
    recs = [(1, False), (1, False), (2, True), (2, False), (3, False)]
    assert wipeout_cover(recs, [1, 2]) == 4  # a dead joiner covers nothing
    assert wipeout_cover(recs, [3]) == 5
    assert wipeout_cover(recs[:3], [1, 2]) is None


# ------------------------------------------------------------------ the settle
from unbroken.core.membership import Report, settle  # noqa: E402


def test_settle_after_a_plain_failure_replans_without_a_roll_forward():
    s = settle([Report(step=7, plan_gen=2), Report(step=7, plan_gen=2)])
    assert (s.lo, s.hi, s.source, s.joiners, s.fresh, s.problem) == (7, 7, None, {}, False, None)
    assert "failure re-plan" in s.reason


def test_settle_rolls_forward_from_the_first_member_ahead_and_admits_named_joiners():
    s = settle([Report(step=4, admitted=0), Report(step=5, admitted=1, planned=True),
                Report(step=5, admitted=1), Report(old=False, joiner_slot=0)])
    assert (s.lo, s.hi, s.source) == (4, 5, 1)
    assert s.joiners == {3: 0} and s.admitted == 1 and s.fresh


def test_settle_takes_a_fresh_plan_when_plans_come_from_different_generations():
    s = settle([Report(step=4, plan_gen=1), Report(step=4, plan_gen=0)])
    assert s.fresh and "different generations" in s.reason


def test_settle_names_the_problems():
    assert settle([Report(step=3), Report(step=5)]).problem == "diverged"
    assert settle([Report(old=False, joiner_slot=1)]).problem == "no state"


def test_leader_gone_on_a_notice_on_silence_or_a_record_never_written():
    from unbroken.core.membership import leader_gone

    assert not leader_gone(2, live=[0, 1, 2], noticed_dead=False, unknown_s=9.0, staleness=0.3)
    assert leader_gone(2, live=[0, 1, 2], noticed_dead=True, unknown_s=0.0, staleness=0.3)
    assert leader_gone(2, live=[0, 1], noticed_dead=False, unknown_s=0.0, staleness=0.3)
    # no record yet: a leader between its two store calls, waited for one staleness
    assert not leader_gone(None, live=[0, 1], noticed_dead=False, unknown_s=0.3, staleness=0.3)
    assert leader_gone(None, live=[0, 1], noticed_dead=False, unknown_s=0.31, staleness=0.3)


def test_a_leader_looks_every_ms_just_after_a_failure_and_every_5_ms_otherwise():
    from unbroken.core.membership import leader_look_s

    assert leader_look_s(after_failure=True, waited_s=0.0) == 0.001
    assert leader_look_s(after_failure=True, waited_s=0.019) == 0.001
    assert leader_look_s(after_failure=True, waited_s=0.02) == 0.005  # late or dead: back off
    assert leader_look_s(after_failure=False, waited_s=0.0) == 0.005  # an admission
