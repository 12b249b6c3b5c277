"""The rung -> action mapping (core.actions) and the guard asking the ladder about deaths,
hangs and wipe-outs (pure: no processes)."""

from __future__ import annotations

from unbroken.core.actions import (
    Evict,
    Quarantine,
    Replace,
    Respawn,
    RestartJob,
    StopJob,
    actions_for,
)
from unbroken.core.ladder import Decision, LadderPolicy, Rung
from unbroken.guard import Guard


def test_each_rung_maps_to_its_actions():
    d = Decision(rung=Rung.MASK, at=0.0, groups=(2,))
    assert actions_for(d, "exit") == [Evict(2, "exit"), Replace(2)]
    d = Decision(rung=Rung.EVICT, at=0.0, groups=(1, 3), replace=1, mask=True, quarantine=(3,))
    assert actions_for(d, "xid") == [Evict(1, "xid"), Evict(3, "xid"), Replace(1),
                                     Quarantine(3)]
    d = Decision(rung=Rung.RETRY, at=0.0, groups=(1, 4))
    assert actions_for(d, "exit", quarantined=frozenset({4})) == [
        Evict(1, "exit"), Respawn(1), Evict(4, "exit"), Replace(4)]  # never in place again
    assert actions_for(Decision(rung=Rung.RETRY, at=0.0), "w", "why") == [RestartJob("why")]
    assert actions_for(Decision(rung=Rung.RESTART, at=0.0), "w", "r") == [RestartJob("r")]
    d = Decision(rung=Rung.REQUEUE, at=0.0, groups=(5,), backoff=8.0)
    assert actions_for(d, "w", "q") == [RestartJob("q", backoff=8.0, exclude=(5,))]
    assert actions_for(Decision(rung=None, at=0.0, exit_code=6), "w", "done") == [
        StopJob(6, "done")]
    assert actions_for(Decision(rung=Rung.REPLAY, at=0.0), "w") == []  # in-band verdicts


def guard(standby=1, maskable=lambda g: True, **policy):
    out: list[dict] = []
    return Guard(out.append, standby=lambda: standby, maskable=maskable,
                 policy=LadderPolicy(**policy)), out


def test_a_death_is_masked_and_its_slot_refilled_even_when_the_guard_only_logs():
    g, out = guard()
    d = g.on_member_lost(1, "exit", 10.0)
    assert d.rung is Rung.MASK and g.orders == [Evict(1, "exit"), Replace(1)]
    (lad,) = [e for e in out if e["event"] == "ladder"]
    assert lad["mode"] == "act" and lad["for"] == "death group 1"
    g.orders.clear()
    assert g.on_member_lost(2, "heartbeat", 11.0).rung is Rung.MASK  # a hang: the same rung
    assert g.orders == [Evict(2, "heartbeat"), Replace(2)]


def test_an_unmaskable_death_climbs_to_evict_with_spares_or_retry_in_place_without():
    g, _ = guard(standby=2, maskable=lambda groups: False)
    assert g.on_member_lost(2, "exit", 10.0).rung is Rung.EVICT
    assert g.orders == [Evict(2, "exit"), Replace(2)]
    g, _ = guard(standby=0)
    d = g.on_wipeout((1, 2), 10.0, "wipe-out")
    assert d.rung is Rung.RETRY  # no spare: fresh processes in both slots
    assert g.orders == [Evict(1, "wipe-out"), Respawn(1), Evict(2, "wipe-out"), Respawn(2)]


def test_restarts_are_the_ladders_budget_not_a_separate_one():
    g, out = guard(standby=0, max_attempts={"restart": 1, "requeue": 1}, backoff_base=3.0)
    rungs = []
    for t in (10.0, 20.0, 30.0, 40.0, 50.0):
        g.orders.clear()
        d = g.on_wipeout((), t, "every member is gone")
        rungs.append(d.rung.name if d.rung else None)
    # no group to name: retry in place (twice), restart, requeue after its backoff, give up
    assert rungs == ["RETRY", "RETRY", "RESTART", "REQUEUE", None]
    assert g.orders == [StopJob(6, [e for e in out if e["event"] == "ladder"][-1]["reason"])]


def test_the_ladder_reads_the_pool_as_it_is_at_each_decision():
    # the supervisor owns the pool; the guard asks for its size when it decides, so a spare
    # used (or one refilled) between two faults changes the answer without any syncing
    pool = [7, 8]
    out: list[dict] = []
    g = Guard(out.append, standby=lambda: len(pool), maskable=lambda groups: False)
    assert g.on_member_lost(1, "exit", 10.0).rung is Rung.EVICT  # a spare for its slot
    pool.clear()                                                  # the pool is used up
    g.orders.clear()
    d = g.on_member_lost(2, "exit", 11.0)
    assert d.rung is Rung.RETRY and g.orders == [Evict(2, "exit"), Respawn(2)]
    pool.append(9)                                                # refilled
    g.orders.clear()
    assert g.on_member_lost(3, "exit", 12.0).rung is Rung.EVICT
    assert g.orders == [Evict(3, "exit"), Replace(3)]


def test_a_spare_promised_to_an_order_not_yet_carried_out_is_not_offered_twice():
    # two unmaskable deaths answered before the supervisor carries out the first answer: the
    # one spare goes to the first; the second gets a fresh process in its slot
    g, _ = guard(standby=1, maskable=lambda groups: False)
    assert g.on_member_lost(1, "exit", 10.0).rung is Rung.EVICT
    assert g.on_member_lost(2, "exit", 10.1).rung is Rung.RETRY
    assert g.orders == [Evict(1, "exit"), Replace(1), Evict(2, "exit"), Respawn(2)]
