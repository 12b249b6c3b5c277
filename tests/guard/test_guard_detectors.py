"""The guard's detectors on their own (``unbroken.guard.failslow``, ``numeric``, ``health``,
``nodes``): the windows they keep, when they judge, and that each finding is reported once.
The Guard's own tests (tests/test_guard.py) drive them through the ladder."""

from __future__ import annotations

import math

from unbroken.core.anomaly import FailSlowPolicy
from unbroken.guard.failslow import FailSlowRounds
from unbroken.guard.health import GroupHealth
from unbroken.guard.nodes import NodeWatch
from unbroken.guard.numeric import POLICIES, NumericWatch


def _feed(fs: FailSlowRounds, t0: float, seconds: int, slow: int | None = None) -> None:
    """4 groups, 10 steps a second each; ``slow`` takes 3x the others' compute."""
    for k in range(seconds * 10):
        t = t0 + k / 10
        for g in range(4):
            fs.add(t, g, 0.3 if g == slow else 0.1)


def test_failslow_judges_only_when_a_round_closes_and_flags_a_group_once():
    fs = FailSlowRounds(FailSlowPolicy(round_s=1.0, rounds=5))
    assert fs.closing(0.0) is None  # nothing seen yet
    _feed(fs, 100.0, 8, slow=2)
    assert fs.closing(104.5) is None  # 5 rounds are not in yet
    n = fs.closing(105.2)
    assert n == 5
    new, reason = fs.judge(n)
    assert new == [2] and "2" in reason
    assert fs.closing(105.9) is None  # the same round: no new verdict
    n = fs.closing(106.1)
    assert n == 6 and fs.judge(n)[0] == []  # still slow, but said already


def test_failslow_keeps_only_the_rounds_a_verdict_reads():
    fs = FailSlowRounds(FailSlowPolicy(round_s=1.0, rounds=5))
    _feed(fs, 0.0, 40)
    fs.judge(fs.closing(40.0))
    assert fs.samples[0][0] >= 40.0 - 2 * 5 * 1.0  # twice K rounds back, no older
    assert fs.flagged == set()  # equal groups: nobody is slow


def test_numeric_history_stays_bounded_and_a_nan_is_found_after_a_long_run():
    nw = NumericWatch()
    for k in range(2000):
        assert nw.observe({"loss": 3.0 - 1e-4 * k, "grad_norm": 1.0}) == []
    for signal, policy in POLICIES.items():
        assert len(nw.history[signal]) <= 8 * policy.window
    (f,) = nw.observe({"loss": math.nan, "grad_norm": 1.0})
    assert (f.signal, f.kind) == ("loss", "nan")


def test_numeric_watch_keeps_a_full_window_of_finite_values_across_nans():
    nw = NumericWatch()
    w = POLICIES["loss"].window
    for k in range(w):
        nw.observe({"loss": 2.0})
    for _ in range(3):  # three NaN steps: events of their own, not part of the next median
        (f,) = nw.observe({"loss": math.inf if _ else math.nan})
        assert f.kind in ("nan", "inf")
    assert nw.history["loss"][-w:] == [2.0] * w and all(map(math.isfinite, nw.history["loss"]))
    assert nw.observe({"loss": 9.9}) == []  # 4.95 x the median of 2.0: fine
    (f,) = nw.observe({"loss": 10.1 * 2})   # > 5 x: a jump
    assert (f.signal, f.kind) == ("loss", "jump")


def _health_rounds(gh: GroupHealth, rounds: int, live: set[int] | None) -> list:
    """5 groups sampled once a second, group 3's memory far above the others'."""
    found = []
    for s in range(rounds):
        t = 10.0 + s
        for u in range(5):
            gh.add(u, {"cpu_util": 0.5, "rss_mb": 900.0 if u == 3 else 200.0 + u, "t": t})
        found += gh.judge(t, live)
        assert gh.judge(t + 0.5, live) == []  # within the second: not judged again
    return found


def test_group_health_judges_once_a_second_and_names_an_outlier_once():
    gh = GroupHealth()
    found = _health_rounds(gh, 6, None)
    assert [u for u, _z, _r in found] == [3]
    u, signals, reason = found[0]
    assert signals["rss_mb"] > 0 and "3 rounds in a row" in reason


def test_group_health_ignores_groups_that_all_wait_but_names_one_that_spins():
    # every group waiting on a stalled peer: CPU use 0.00-0.01 of a core. The z-score of 0.01
    # against peers at 0.00 is 1e7 (a CI run alerted on it); the gap is a hundredth of a core
    gh = GroupHealth()
    for s in range(5):
        for u in range(4):
            gh.add(u, {"cpu_util": 0.01 if u >= 2 else 0.0, "rss_mb": 300.0, "t": 10.0 + s})
        assert gh.judge(10.0 + s, None) == []
    # one group spinning at a full core while the others wait: named, after 3 rounds
    found = []
    for s in range(5, 9):
        for u in range(4):
            gh.add(u, {"cpu_util": 1.0 if u == 1 else 0.01, "rss_mb": 300.0, "t": 10.0 + s})
        found += gh.judge(10.0 + s, None)
    assert [u for u, _z, _r in found] == [1] and found[0][1]["cpu_util"] > 4


def test_group_health_leaves_out_groups_that_are_not_live():
    assert _health_rounds(GroupHealth(), 4, {0, 1, 2, 4}) == []


def test_node_watch_floors_once_while_they_last_and_peers_after_three_samples():
    nw = NodeWatch()
    base = {"mem_total_mb": 64000.0, "disk_free_mb": 50000.0, "cpus": 8.0,
            "mem_avail_mb": 32000.0}
    alerts = []
    for s in range(5):
        for n in range(5):
            # node 1: load 1.5 per CPU against 0.25 (above its peers, under the fixed floor)
            ev = dict(base, node=n, t=float(s), load1=12.0 if n == 1 else 2.0)
            if n == 2 and s < 3:
                ev["disk_free_mb"] = 10.0  # under the floor for three samples, then freed
            alerts += [(a["how"], a["node"], a["t"]) for a in nw.observe(ev)]
    # node 1's first sample had one peer so far (3 are needed): its samples 1-3 stand out
    assert alerts == [("node_health", 2, 0.0), ("node_peers", 1, 3.0)]
    # the floor problem ended at sample 3; it comes back: said again
    assert [a["how"] for a in nw.observe(dict(base, node=2, t=5.0, load1=2.0,
                                              disk_free_mb=10.0))] == ["node_health"]
