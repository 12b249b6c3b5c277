"""core.changepoint: peer z against brute force, the Lindley CUSUM against its loop, the unit's
own baseline per regime, and the detector on shapes it assumes nothing about."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from unbroken.core import changepoint as C

BASE = C.ChangePolicy(k=1.5, cap=6.0, block=20, history=6)


def test_peer_z_matches_brute_force():
    rng = np.random.default_rng(0)
    x = rng.normal(50, 3, (9, 30)) * rng.uniform(0.8, 1.2, (9, 1))
    live = rng.random((9, 30)) > 0.2
    z, level = C.peer_z(x, live, floor=0.5, rel_floor=0.01)
    for n in range(9):
        for t in range(30):
            vals = x[live[:, t], t]
            if not live[n, t]:
                assert np.isnan(z[n, t])
                continue
            peers = x[[m for m in range(9) if m != n and live[m, t]], t]
            mad = 1.4826 * np.median(np.abs(vals - np.median(vals)))
            scale = max(mad, 0.01 * abs(np.median(vals)), 0.5)
            assert z[n, t] == pytest.approx((x[n, t] - np.median(peers)) / scale)
            assert level[t] == pytest.approx(np.median(vals))


def test_too_few_peers_is_no_decision():
    x = np.arange(20.0).reshape(4, 5)
    z, _ = C.peer_z(x, np.ones((4, 5), bool), ok_t=np.array([1, 1, 0, 1, 0], bool))
    assert np.isnan(z[:, [2, 4]]).all() and np.isfinite(z[:, [0, 1, 3]]).all()


def test_cusum_is_the_recursion():
    rng = np.random.default_rng(1)
    x = rng.normal(-0.3, 1.0, (3, 200))
    got = C.cusum(x)
    for row in range(3):
        s = 0.0
        for t in range(200):
            s = max(0.0, s + x[row, t])
            assert got[row, t] == pytest.approx(s)


def test_baseline_learns_an_offset_but_not_a_precursor():
    """A unit sitting 2.5 z from its peers for good has no evidence once its baseline is
    learnt; a later step of 4 z is refused by the gate and keeps adding up, until ``history``
    refused blocks say the unit has really moved."""
    T = 20 * 40
    z = np.full((2, T), 2.5)
    z[1] = 0.0
    z += np.random.default_rng(2).normal(0, 0.3, (2, T))
    z[0, 400:] += 4.0
    r = C.deviation(z, BASE)
    assert np.isnan(r[:, :60]).all()                     # three blocks before a baseline
    assert np.nanmax(np.abs(r[:, 80:400])) < 1.5          # the offset is the unit's normal
    assert np.median(r[0, 420:500]) > 3.0                 # the step is not
    # 6 refused blocks, then a fresh baseline of 3 blocks (no evidence meanwhile), lagged one
    after = 400 + (BASE.history + C.MIN_BLOCKS + 2) * BASE.block
    assert np.isfinite(r[0, after:]).all()
    assert abs(np.median(r[0, after:])) < 1.0             # the unit has really moved


def test_regimes_keep_load_and_idle_baselines_apart():
    """Under load a GPU draws 4 % more than its peers, at idle the same: with one baseline the
    idle minutes would look like a change every time; per regime they do not."""
    rng = np.random.default_rng(3)
    U, T = 16, 2000
    busy = (np.arange(T) // 37) % 3 != 0                  # idle a third of the time
    off = np.where(np.arange(U) == 0, 1.04, 1.0)[:, None] * rng.normal(1, 0.005, (U, 1))
    x = np.where(busy, 90 + 600 * off, 90.0) + rng.normal(0, 2, (U, T))
    z, level = C.peer_z(x, np.ones((U, T), bool), floor=10, rel_floor=0.01)
    reg = C.regimes(level, 10)
    assert set(np.unique(reg)) == {6, 9}                  # ~90 W and ~690 W
    pol = C.ChangePolicy(k=1.5, cap=6, block=60, history=12)
    s_one = C.clipped_cusum(C.deviation(z, pol), 1.5, 6)
    s_reg = C.clipped_cusum(C.deviation(z, pol, reg), 1.5, 6)
    assert s_one[0, 500:].max() > 20
    assert s_reg[0, 500:].max() < 5


def _cluster(shape: str, seed: int = 4, U: int = 32, T: int = 2400, G: int = 4):
    """U units (G per node), noise only, and one unit with ``shape`` from scrape 1500."""
    rng = np.random.default_rng(seed)
    x = 100 + rng.normal(0, 1, (U, 1)) + rng.normal(0, 1, (U, T))
    t = np.arange(T)
    on = t >= 1500
    if shape == "step":
        x[5, on] -= 3.5
    elif shape == "drift":
        x[5, on] += 8 * (t[on] - 1500) / (T - 1500)
    elif shape == "oscillation":
        x[5, on] += 4 * np.sin(2 * np.pi * (t[on] - 1500) / 12)
    elif shape == "burst":
        x = rng.poisson(0.01, (U, T)).astype(float)
        hit = on & (rng.random(T) < 0.08)
        x[5, hit] += rng.integers(2, 8, hit.sum())
    node_of = np.repeat(np.arange(U // G), G)
    return x, node_of


@pytest.mark.parametrize("shape", ["step", "drift", "oscillation", "burst"])
def test_shapes_add_up_on_their_node_only(shape):
    x, node_of = _cluster(shape)
    N = node_of.max() + 1
    sides = "up" if shape == "burst" else "both"
    live = np.ones((N, x.shape[1]), bool)
    quiet_x, _ = _cluster("none", seed=5)
    if shape == "burst":
        quiet_x = np.random.default_rng(5).poisson(0.01, x.shape).astype(float)
    pol = C.ChangePolicy(k=1.5, cap=6.0, block=60, history=12, thresholds={"s": 1.0})
    ev_quiet = C.detect_change({"s": quiet_x}, {"s": node_of}, live, {"s": 1.0}, {"s": sides},
                               {"s": "f"}, pol)[1]["s"]
    h = float(ev_quiet.max()) + 1.0                       # above everything healthy
    det, ev = C.detect_change({"s": x}, {"s": node_of}, live, {"s": 1.0}, {"s": sides},
                              {"s": "f"}, pol.with_thresholds({"s": h}))
    assert det.alert[1].any()                             # unit 5 is node 1's second GPU
    assert not np.delete(det.alert, 1, axis=0).any()
    assert np.flatnonzero(det.alert[1])[0] >= 1500        # not before it started


def test_combine_one_strong_signal_or_two_families():
    T = 10
    ev = {"a": np.zeros((2, T)), "b": np.zeros((2, T)), "c": np.zeros((2, T))}
    fam = {"a": "fa", "b": "fa", "c": "fc"}
    pol = C.ChangePolicy(thresholds={"a": 10.0, "b": 10.0, "c": 10.0}, pair=0.6)
    ev["a"][0, 1] = 11                                    # one signal over its threshold
    ev["a"][0, 3] = ev["b"][0, 3] = 7                     # two signals, one family: no
    ev["a"][0, 5] = ev["c"][0, 5] = 7                     # two families over pair: yes
    ev["a"][0, 7] = 10                                    # exactly at h: not above
    d = C.combine(ev, fam, pol)
    assert np.flatnonzero(d.alert[0]).tolist() == [1, 5]
    assert not d.alert[1].any()
    assert d.families_firing[0, 5] == 2 and d.firing["c"][0, 5]
    with pytest.raises(C.ChangeError, match="no signal with a threshold"):
        C.combine({"x": ev["a"]}, fam, pol)


def test_combine_pairs_is_combine_at_each_pair():
    """The detector fit's shared pass: at every pair, bit for bit what ``combine`` gives with
    that pair in the policy (alerts, firing, family counts, level, the policy itself)."""
    rng = np.random.default_rng(3)
    ev = {s: rng.gamma(0.5, 4.0, size=(5, 200)) for s in "abcd"}
    fam = {"a": "fa", "b": "fa", "c": "fc", "d": "fd"}
    pol = C.ChangePolicy(thresholds={s: 8.0 + i for i, s in enumerate("abcd")}, pair=0.7)
    pairs = (0.5, 0.7, 1.0)
    got = C.combine_pairs(ev, fam, pol, pairs)
    assert len({tuple(np.flatnonzero(d.alert)) for d in got}) == 3  # the pair matters here
    for pair, d in zip(pairs, got):
        want = C.combine(ev, fam, replace(pol, pair=pair))
        assert d.policy == want.policy and d.policy.pair == pair
        for name in ("alert", "families_firing", "level"):
            assert np.array_equal(getattr(d, name), getattr(want, name)), name
        assert d.firing.keys() == want.firing.keys()
        assert all(np.array_equal(d.firing[s], want.firing[s]) for s in d.firing)


@pytest.mark.parametrize("kw,word", [({"pair": 1.5}, "pair"), ({"k": 7.0}, "cap"),
                                     ({"thresholds": {"a": -1}}, "threshold a"),
                                     ({"block": 0}, "block"), ({"k": float("nan")}, "k")])
def test_bad_policy_names_the_value(kw, word):
    with pytest.raises(C.ChangeError, match=word):
        C.ChangePolicy(**kw).check()



@pytest.mark.parametrize("shape", [(48, 8), (5, 1), (7, 3, 60), (3, 2)])
def test_nanmedian_last_is_numpys_to_the_bit(shape):
    """The baselines' median: numpy's own values (rows of NaN, infinities, even and odd
    counts), bit for bit, so a detector fitted before the change scores the same after it."""
    rng = np.random.default_rng(sum(shape))
    for trial in range(300):
        a = rng.normal(size=shape) * 10.0 ** rng.integers(-3, 6)
        a[rng.random(shape) < rng.random()] = np.nan
        if trial % 3 == 0:
            a[rng.random(shape) < 0.1] = np.inf
            a[rng.random(shape) < 0.1] = -np.inf
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows, inf - inf
            want = np.nanmedian(a, axis=-1)
        got = C.nanmedian_last(a)
        assert got.shape == want.shape
        assert np.array_equal(got, want, equal_nan=True), (a, got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("families", [1, 2, 3, 6])
def test_top_two_picks_what_a_partition_of_the_stack_picks(families):
    """The detector's best and second-best family, bit for bit the values ``np.partition``
    over the stack picks (ties included), 0 for the second of one family; with a NaN the
    partition's order (NaN last) holds."""
    rng = np.random.default_rng(families)
    for tied in (False, True):
        qs = [rng.choice([0.0, 0.5, 1.5], size=(4, 50)) if tied else rng.gamma(1.0, size=(4, 50))
              for _ in range(families)]
        first, second = C.top_two(qs)
        if families == 1:
            assert first is qs[0] and not second.any()
            continue
        top = np.partition(np.stack(qs), families - 2, axis=0)
        assert np.array_equal(first, top[-1]) and np.array_equal(second, top[-2])
        assert (first >= second).all()
    if families > 1:
        qs[0][0, 0] = np.nan
        first, second = C.top_two(qs)
        top = np.partition(np.stack(qs), families - 2, axis=0)
        assert np.array_equal(first, top[-1], equal_nan=True)
        assert np.array_equal(second, top[-2], equal_nan=True)
