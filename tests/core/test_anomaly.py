"""core.anomaly: fail-slow streaks (byterobust §6), numeric implicit failures (byterobust §3),
robust peer z-score outliers (backendai §2)."""

import math

import pytest

from unbroken.core.anomaly import (
    INF,
    JUMP,
    NAN,
    AnomalyError,
    FailSlowPolicy,
    NumericPolicy,
    PeerPolicy,
    bucket_rounds,
    failslow,
    median,
    numeric_event,
    peer_outliers,
    robust_z,
)

HEALTHY = {0: 1.00, 1: 1.02, 2: 0.98, 3: 1.01}


def _round(slow: dict | None = None) -> dict:
    return {**HEALTHY, **(slow or {})}


# --- fail-slow -------------------------------------------------------------------------------

def test_failslow_defaults_follow_the_references():
    p = FailSlowPolicy()
    assert (p.rounds, p.round_s, p.factor, p.min_groups) == (5, 10.0, 1.5, 3)
    d = FailSlowPolicy.demo()
    assert (d.rounds, d.round_s) == (5, 1.0) and d.window_s == 5.0


def test_failslow_flags_exactly_the_slow_group_after_k_rounds_and_not_before():
    p = FailSlowPolicy()
    rounds = []
    for k in range(1, 7):
        rounds.append(_round({2: 2.0}))
        flagged, reason = failslow(rounds, p)
        if k < 5:
            assert flagged == [], (k, reason)
        else:
            assert flagged == [2], (k, reason)
            assert "group 2" in reason and "5 consecutive" in reason


def test_failslow_one_slow_round_or_a_broken_streak_is_not_flagged():
    p = FailSlowPolicy()
    one = [_round() for _ in range(4)] + [_round({1: 5.0})]
    assert failslow(one, p)[0] == []
    broken = [_round({1: 2.0})] * 4 + [_round()] + [_round({1: 2.0})] * 4
    flagged, reason = failslow(broken, p)
    assert flagged == [] and "longest streak 4" in reason
    recovered = [_round({1: 2.0})] * 6 + [_round()]
    assert failslow(recovered, p)[0] == []


def test_failslow_factor_is_strict_and_needs_enough_groups():
    p = FailSlowPolicy()
    # exactly 1.5x the peer median (1.0) is not above it
    at = [{0: 1.0, 1: 1.0, 2: 1.0, 3: 1.5}] * 5
    assert failslow(at, p)[0] == []
    above = [{0: 1.0, 1: 1.0, 2: 1.0, 3: 1.51}] * 5
    assert failslow(above, p)[0] == [3]
    # two groups cannot tell who is slow (min_groups = 3); a missing group breaks its streak
    assert failslow([{0: 1.0, 1: 3.0}] * 5, p)[0] == []
    gap = [_round({3: 2.0})] * 2 + [{0: 1.0, 1: 1.0, 2: 1.0}] + [_round({3: 2.0})] * 3
    assert failslow(gap, p)[0] == []


def test_failslow_rejects_bad_input_with_the_value_named():
    with pytest.raises(AnomalyError, match="factor=1"):
        FailSlowPolicy(factor=1)
    with pytest.raises(AnomalyError, match="round_s=0"):
        FailSlowPolicy(round_s=0)
    with pytest.raises(AnomalyError, match="rounds=0"):
        FailSlowPolicy(rounds=0)
    with pytest.raises(AnomalyError, match="min_groups=1"):
        FailSlowPolicy(min_groups=1)
    with pytest.raises(AnomalyError, match="nan"):
        failslow([{0: 1.0, 1: float("nan"), 2: 1.0}])
    with pytest.raises(AnomalyError, match="must be > 0"):
        failslow([{0: 1.0, 1: -1.0, 2: 1.0}])
    with pytest.raises(AnomalyError, match="not a mapping"):
        failslow([[1.0, 2.0]])


def test_bucket_rounds_medians_per_round_and_feeds_failslow():
    p = FailSlowPolicy.demo()  # 1 s rounds
    samples = []
    for r in range(5):
        for g in range(4):
            for j in range(3):
                st = 0.3 if g == 1 else 0.1
                if g == 0 and j == 0:
                    st = 0.9  # one stray slow step per round does not make group 0 slow
                samples.append((100.0 + r + 0.3 * j, g, st))
    rounds = bucket_rounds(samples, start=100.0, policy=p)
    assert len(rounds) == 5 and rounds[0] == {0: 0.1, 1: 0.3, 2: 0.1, 3: 0.1}
    assert failslow(rounds, p)[0] == [1]
    # an empty round in between is kept (and decides nothing)
    sparse = bucket_rounds([(0.5, 0, 1.0), (2.5, 0, 1.0), (-1.0, 0, 9.0)], 0.0, p)
    assert sparse == [{0: 1.0}, {}, {0: 1.0}]
    with pytest.raises(AnomalyError, match="not \\(t, group, step_time\\)"):
        bucket_rounds([(1.0, 0)], 0.0, p)


# --- numeric ---------------------------------------------------------------------------------

LOSS = [3.2, 3.1, 3.0, 3.05, 2.95, 3.0, 2.9]   # median 3.0


@pytest.mark.parametrize("value, kind", [(float("nan"), NAN), (float("inf"), INF),
                                         (float("-inf"), INF)])
def test_nan_and_inf_fire_at_once_even_without_history(value, kind):
    for hist in ([], LOSS):
        ev, reason = numeric_event(hist, value)
        assert ev is not None and ev.kind == kind, reason


def test_a_6x_jump_fires_and_a_4x_does_not():
    ev, reason = numeric_event(LOSS, 18.0)
    assert ev is not None and ev.kind == JUMP and ev.baseline == 3.0
    assert math.isclose(ev.ratio, 6.0) and "6.00" in reason
    ev, reason = numeric_event(LOSS, 12.0)
    assert ev is None and "4.00" in reason
    assert numeric_event(LOSS, 15.0)[0] is None  # exactly 5x is not over 5x


def test_jump_needs_history_and_uses_the_recent_median():
    assert numeric_event([1.0, 1.0], 100.0)[0] is None       # fewer than min_history
    # one earlier spike and earlier NaNs do not raise the bar (median, finite only)
    hist = [1.0, 1.0, 50.0, float("nan"), 1.0, 1.0, 1.0]
    ev, _ = numeric_event(hist, 6.0)
    assert ev is not None and ev.baseline == 1.0
    # only the last `window` values count: an old high plateau is forgotten
    p = NumericPolicy(window=5, min_history=5)
    assert numeric_event([100.0] * 10 + [1.0] * 5, 6.0, p)[0] is not None
    assert numeric_event([0.0] * 6, 1.0)[0] is None           # no positive baseline


def test_numeric_rejects_bad_input():
    with pytest.raises(AnomalyError, match="jump=1"):
        NumericPolicy(jump=1)
    with pytest.raises(AnomalyError, match="min_history=30 exceeds window=20"):
        NumericPolicy(min_history=30)
    with pytest.raises(AnomalyError, match="value='x'"):
        numeric_event(LOSS, "x")
    with pytest.raises(AnomalyError, match=r"history\[1\]=None"):
        numeric_event([1.0, None], 1.0)


# --- peer outliers ---------------------------------------------------------------------------

def _fleet(n=8):
    # realistic spread across peers: step time and temperature vary a little
    return {g: {"step_s": 1.0 + 0.01 * (g % 3), "gpu_temp": 60.0 + (g % 4),
                "irq_per_30s": 300e3 + 5e3 * (g % 5)} for g in range(n)}


def test_peer_outliers_flag_the_planted_outlier_only():
    sig = _fleet()
    sig[5] = {**sig[5], "gpu_temp": 91.0}                    # one hot group
    sig[2] = {**sig[2], "irq_per_30s": 80e3}                 # interrupts collapse (gpu071)
    flags, reason = peer_outliers(sig)
    assert set(flags) == {5, 2}
    assert set(flags[5]) == {"gpu_temp"} and flags[5]["gpu_temp"] > 4
    assert set(flags[2]) == {"irq_per_30s"} and flags[2]["irq_per_30s"] < -4
    assert "group 5" in reason and "gpu_temp" in reason
    # min_signals = 2 (the reference's production suggestion) flags neither
    assert peer_outliers(sig, PeerPolicy(min_signals=2))[0] == {}


def test_peer_outliers_quiet_on_a_healthy_fleet_and_with_too_few_peers():
    flags, _ = peer_outliers(_fleet())
    assert flags == {}
    few = {0: {"t": 1.0}, 1: {"t": 1.0}, 2: {"t": 9.0}}      # 2 peers each < min_peers 3
    flags, reason = peer_outliers(few)
    assert flags == {} and "too few peers" in reason


def test_identical_peers_need_a_real_deviation():
    same = {g: {"step_s": 1.0} for g in range(5)}
    assert peer_outliers({**same, 9: {"step_s": 1.1}})[0] == {}     # 10 % < 4 x 5 % floor
    assert 9 in peer_outliers({**same, 9: {"step_s": 1.3}})[0]      # 30 % > 20 %
    assert robust_z(1.3, [1.0] * 5) == pytest.approx(6.0)
    assert median([3, 1, 2, 10]) == 2.5


def test_peer_outliers_reject_bad_input():
    with pytest.raises(AnomalyError, match="signal 'x' of group 1=nan"):
        peer_outliers({0: {"x": 1.0}, 1: {"x": float("nan")}})
    with pytest.raises(AnomalyError, match="not a mapping"):
        peer_outliers({0: [1.0]})
    with pytest.raises(AnomalyError, match="band=50"):
        PeerPolicy(band=50)


def test_stall_needs_a_first_step_and_a_quiet_threshold():
    from unbroken.core.anomaly import STALL_S, stall_suspected

    assert not stall_suspected(100.0, 0.0, started=False)  # start-up is not a stall
    assert not stall_suspected(10.0 + STALL_S, 10.0, started=True)
    assert stall_suspected(10.0 + STALL_S + 0.01, 10.0, started=True)


def test_persisting_counts_consecutive_rounds_and_fires_once_at_the_threshold():
    from unbroken.core.anomaly import persisting

    hits, due = {}, []
    fired = []
    for flagged in ([2], [2, 3], [3], [2, 3], [2, 3], [2, 3]):
        hits, due = persisting(hits, flagged, 3)
        fired.append(due)
    assert fired == [[], [], [], [3], [], [2]]  # 2 started over at round 3; 3 never broke off
