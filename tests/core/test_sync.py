"""core.sync and sync.trace: the update gap, the TTA heuristic, auto, the noise scale."""

import math
from dataclasses import replace

import numpy as np
import pytest

from unbroken.core import placement, rectlr
from unbroken.core.sync.gap import _star_code_choice, _star_code_k, _star_intended_choice
from unbroken.core.sync import (AutoState, CostModel, NoiseScale, cluster_times, decide, estimates,
                                flag_stragglers, ksync_gap, noise_scale_terms, parse_mode,
                                select, star_k_scan, tta_of)
from unbroken.sync.trace import parse_spec, slowdowns, straggler_frequency


def test_parse_mode_names_and_bad_values():
    assert str(parse_mode("ksync:3", 4)) == "ksync:3"
    assert parse_mode("auto", 4).name == "auto"
    for bad, word in (("ksync:5", r"outside \[1, 4\]"), ("ksync:0", "outside"),
                      ("ksync", "needs K"), ("ksync:x", "not an integer"),
                      ("fast", "unknown sync mode 'fast'")):
        with pytest.raises(ValueError, match=word) as e:
            parse_mode(bad, 4)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("t", [[1.0, 1.0, 1.0, 2.0], [0.3, 0.5, 0.9, 1.7, 2.2]])
def test_ksync_closed_forms_match_the_monte_carlo(t):
    n = len(t)
    for k in (1, n):
        closed = ksync_gap(t, k)
        mc = ksync_gap(t, k, updates=4000, closed_form=False)
        assert mc.gap == pytest.approx(closed.gap, rel=0.01)
        assert mc.staleness == pytest.approx(closed.staleness, abs=0.05 * n)
    assert ksync_gap(t, n).gap == max(t)
    assert ksync_gap(t, 1).gap == pytest.approx(1 / sum(1 / x for x in t))
    # the gap grows with k: waiting for more gradients never shortens the interval
    gaps = [ksync_gap(t, k).gap for k in range(1, n + 1)]
    assert gaps == sorted(gaps)


def test_ksync_gap_is_seeded_and_trace_driven():
    t = [1.0, 1.0, 1.0, 1.0]  # all ties: the tie-break is random
    assert ksync_gap(t, 2, seed=3) == ksync_gap(t, 2, seed=3)
    # a trace where group 3 is slow on every other iteration: between its 1x and 2x
    trace = np.ones((2, 4))
    trace[1, 3] = 3.0
    g = ksync_gap(trace, 4).gap
    assert g == pytest.approx(2.0, rel=0.01)


def test_clustering_threshold_scales_with_the_step():
    for scale in (0.02, 60.0):  # STAR's fixed 50 ms would lump the first and split the second
        t = np.array([1.0, 1.02, 1.05, 2.0, 2.05]) * scale
        assert cluster_times(t) == [[0, 1, 2], [3, 4]]
        assert cluster_times(t, fraction=0.01) != [[0, 1, 2], [3, 4]]


def test_heuristic_keeps_sync_without_stragglers_and_leaves_it_with_one():
    cm = CostModel(shard_batch=8, noise_scale=256, comm_s=0.1, redundancy=2)
    assert select([1.0] * 8, cm).mode == "sync"
    assert select([1.0, 1.05, 1.0, 1.1, 1.0, 1.0, 1.0, 1.0], cm).mode == "sync"
    s = select([1.0] * 7 + [2.0], cm)
    assert s.mode != "sync"
    assert s.estimates[s.mode.split(":")[0]].tta < 0.98 * s.estimates["sync"].tta
    assert set(s.estimates) == {"sync", "mask", "ksync", "groups", "async"}
    assert s.reason.startswith(s.mode)


def test_async_loses_at_a_large_noise_scale():
    # LLM-like regime (phi >> global batch): small async updates are nearly worthless
    cm = CostModel(shard_batch=8, noise_scale=1e5, redundancy=2)
    est = estimates([1.0] * 7 + [3.0], cm)
    assert est["async"].tta > max(est["groups"].tta, est["ksync"].tta)
    assert est["async"].staleness == 7
    quiet = estimates([1.0] * 8, cm)
    assert quiet["async"].tta > 1.5 * quiet["sync"].tta


def test_mask_cost_comes_from_rectlr_stack_depths():
    n, r = 8, 3
    t = np.array([1.0] * n)
    t[[2, 5]] = 4.0
    cm = CostModel(shard_batch=8, noise_scale=64, comm_s=0.2, redundancy=r)
    est = estimates(t, cm)["mask"]
    layout = placement.make_layout(n, r)
    live = np.ones(n, dtype=bool)
    live[[2, 5]] = False
    plan = rectlr.decide(layout, live, rectlr.initial_stacks(layout), 1)
    depth = max(len(ts) for ts in plan.contributions().values())
    assert depth >= 2
    assert est.gap == pytest.approx(depth * 0.8 + 0.2)
    assert est.batch == n * 8 and est.staleness == 0  # the synchronous gradient
    # a straggler slower than the extra stack: mask beats sync; a mild one: it does not
    assert est.tta < estimates(t, cm)["sync"].tta
    mild = np.array([1.0] * n)
    mild[2] = 1.5
    assert estimates(mild, cm)["mask"].tta >= estimates(mild, cm)["sync"].tta
    # no redundancy, or two adjacent stragglers that wipe out a type at r = 2: not available
    assert math.isinf(estimates(t, CostModel(redundancy=1))["mask"].tta)
    lay2 = placement.make_layout(n, 2)
    t2 = np.array([1.0] * n)
    t2[[0, 1]] = 4.0
    assert isinstance(rectlr.decide(lay2, [2, 3, 4, 5, 6, 7], rectlr.initial_stacks(lay2), 1),
                      rectlr.WipeOut)
    assert math.isinf(estimates(t2, CostModel(redundancy=2))["mask"].tta)


def test_star_scan_carries_the_gap_the_code_forgets():
    # the code compares every candidate against 1/sum(1/t) and stops too early; the intended
    # scan carries the gap for i workers and adds two more workers, lower on STAR's own
    # objective (interpolated gap x iters). The Monte-Carlo gap with staleness disagrees here:
    # the scan is a greedy approximation, which is why every mode's TTA is also reported.
    t = [2.24, 2.38, 2.49, 2.59, 3.27, 3.36]
    cm = CostModel(shard_batch=1, noise_scale=64.0)
    k, _ = star_k_scan(t, cm)
    k_code, _ = _star_code_k(t, cm)
    assert (k, k_code) == (4, 2)
    ta, tm = 1 / sum(1 / x for x in t), max(t)

    def star_objective(i):  # gap for i workers, interpolated as in star.md section 4
        return (ta + (tm - ta) * (t[i - 1] - t[0]) / (tm - t[0])) * cm.iters(i)
    assert star_objective(k) < star_objective(k_code)
    assert tta_of(f"ksync:{k}", t, cm) > tta_of(f"ksync:{k_code}", t, cm)


def test_star_code_quirks_choose_the_slower_mode():
    # one persistent 4x straggler: the intended rule picks the lower TTA; the code's inverted
    # comparison (and worker-id times) picks the other one
    cm = CostModel(shard_batch=8, noise_scale=64)
    t = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0]
    intended, code = _star_intended_choice(t, cm), _star_code_choice(t, cm)
    assert intended != code
    est = estimates(t, cm)
    fam = {"groups": est["groups"].tta, est["ksync"].mode: est["ksync"].tta}
    assert fam[intended] <= min(fam.values()) * 1.05


def test_flags_have_hysteresis():
    t = [1.0, 1.15, 1.3]
    assert flag_stragglers(t) == (2,)
    assert flag_stragglers(t, already=(1, 2)) == (1, 2)       # 1.15 > 1.1: stays flagged
    assert flag_stragglers([1.0, 1.05, 1.3], already=(1, 2)) == (2,)


def test_auto_switches_on_a_confirmed_straggler_and_returns_to_sync():
    cm = CostModel(shard_batch=8, noise_scale=256, comm_s=0.1, redundancy=2)
    quiet, slow = [1.0] * 8, [1.0] * 7 + [2.5]
    s = AutoState()
    d = decide(s, quiet, cm)
    assert (d.mode, d.switched) == ("sync", False)
    d = decide(d.state, slow, cm)                 # first sighting: wait (confirm = 2)
    assert d.mode == "sync" and "1/2" in d.reason
    d = decide(d.state, quiet, cm)                # a blip: back to nothing pending
    d = decide(d.state, slow, cm)
    d = decide(d.state, np.array([slow, slow]), cm)  # an (H, N) prediction is averaged
    assert d.switched and d.mode != "sync" and d.selection is not None
    mode = d.mode
    d = decide(d.state, [1.0] * 7 + [1.15], cm)   # within the release band: no flap
    assert d.mode == mode and not d.switched
    d = decide(decide(d.state, quiet, cm).state, quiet, cm)
    assert (d.mode, d.switched) == ("sync", True)


def test_noise_scale_recovers_a_known_phi():
    rng = np.random.default_rng(0)
    dim, b_small, groups = 50, 4, 8
    g_true = rng.normal(0, 1, dim) * 0.3
    sd = rng.uniform(0.5, 1.5, dim)
    phi_true = float(np.sum(sd ** 2) / np.sum(g_true ** 2))
    est = NoiseScale(beta=0.995)
    for _ in range(2000):
        per = g_true + rng.normal(0, 1, (groups, b_small, dim)) * sd  # per-sample gradients
        small = per.mean(axis=1)                                      # each group's shard
        big = small.mean(axis=0)                                      # the reduced gradient
        est.update(np.sum(small ** 2, axis=1), b_small, float(np.sum(big ** 2)),
                   b_small * groups)
    assert est.phi == pytest.approx(phi_true, rel=0.05)
    g2, s = noise_scale_terms(2.0, 1, 1.0, 3)
    assert (g2, s) == pytest.approx((0.5, 1.5))
    with pytest.raises(ValueError):
        noise_scale_terms(1.0, 4, 1.0, 4)


def test_straggler_specs():
    m = slowdowns("persistent:1@2,3@1.5", 4, 10)
    assert m.shape == (10, 4) and np.all(m[:, 1] == 2) and np.all(m[:, 3] == 1.5)
    assert np.all(m[:, [0, 2]] == 1)
    b1, b2 = slowdowns("bursty:7", 8, 200), slowdowns("bursty:7", 8, 200)
    assert np.array_equal(b1, b2) and b1.min() >= 1 and b1.max() > 2
    r = slowdowns("rotating:0.5", 8, 1000, seed=1)
    assert 0.4 < np.mean(r.max(axis=1) > 1) < 0.6
    assert straggler_frequency(r) == pytest.approx(np.mean(r.max(axis=1) > 1))
    for bad, word in (("persistent:1@0.5", "below 1.0"), ("rotating:2", "outside"),
                      ("persistent:x@2", "not an integer"), ("bursty:", "not persistent")):
        with pytest.raises(ValueError, match=word):
            parse_spec(bad)
    with pytest.raises(ValueError, match="group 4 outside"):
        slowdowns("persistent:4@2", 4, 10)


def test_straggler_csv(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("step,group,slowdown\n0,1,2.0\n5,1,1.0\n3,0,1.5\n")
    m = slowdowns(str(p), 2, 8)
    assert m[:, 1].tolist() == [2.0] * 5 + [1.0] * 3
    assert m[:, 0].tolist() == [1.0] * 3 + [1.5] * 5
    for body, word in (("0,1,0.5\n", "below 1.0"), ("0,1\n", "expected step,group"),
                       ("a,1,2\n", "bad row")):
        p.write_text(body)
        with pytest.raises(ValueError, match=word):
            parse_spec(str(p))
    p.write_text("0,9,2\n")
    with pytest.raises(ValueError, match="group 9 outside"):
        slowdowns(str(p), 2, 8)


# ----------------------------------------------------------------------------- runtime modes

def test_predict_times_is_the_lower_envelope_and_waits_for_every_group():
    from unbroken.core.sync import predict_times

    assert predict_times([]) is None
    # a group not measured on any step of the window (left out, not probed): no prediction
    assert predict_times([[1.0, 0.0], [2.0, 0.0]]) is None
    # the load of a shared machine only adds time: the fastest measurement is the prediction
    assert predict_times([[1.0, 3.0], [5.0, 0.0], [1.2, 2.9]]) == [1.0, 2.9]


def test_blocked_time_is_split_off_exactly_and_followed_over_a_short_window():
    from unbroken.core.sync import predict_times, split_times, uncontended

    cm = CostModel.for_runtime(8, 2, cores=2)
    walls, cpus = [0.034, 0.051, 0.040, 0.034], [0.017, 0.017, 0.017, 0.0]
    # group 0: its fair share of the 2 cores (17 ms waiting); group 1: asleep 17 ms on top;
    # group 2: 23 ms waiting (the scheduler's unfairness, not sleep); group 3: CPU unknown
    on, off = split_times(walls, cpus, [0.017, 0.017, 0.023, -1.0], cm)
    assert off == pytest.approx([0.0, 0.017, 0.0, 0.0])
    assert on == pytest.approx([0.017, 0.017, 0.023, 0.017])
    # the two parts add up to what uncontended makes of the whole
    assert [a + b for a, b in zip(on, off)] == pytest.approx(uncontended(walls, cpus, cm))
    # a wait unknown: everything on a core, as before
    assert split_times(walls, cpus, [-1.0] * 4, cm) == (uncontended(walls, cpus, cm),
                                                        [0.0] * 4)
    dev = replace(cm, cores=0)  # a device per group: on a core = CPU + wait
    assert split_times([0.05, 0.0], [0.01, 0.0], [0.01, 0.0], dev) == \
        (pytest.approx([0.02, 0.0]), pytest.approx([0.03, 0.0]))
    # the prediction: the long window's envelope of the on-core parts plus the short one's
    # of the blocked parts (-1: not measured); a sleep 3 steps old already counts in full
    pred = predict_times([[1.0, 1.0], [1.1, 1.2], [1.0, 1.0]], [[2.0, -1.0], [2.1, 0.5]])
    assert pred == pytest.approx([3.0, 1.5])
    assert predict_times([[1.0, 1.0]], [[-1.0, -1.0]]) == [1.0, 1.0]
    # a generation's warm-up: no prediction until every group has min_measured measurements
    two = [[2.5, 3.1], [1.5, 2.0], [0.0, 0.0]]
    assert predict_times(two) == [1.5, 2.0]
    assert predict_times(two, min_measured=3) is None
    assert predict_times(two + [[1.4, 1.6]], min_measured=3) == [1.4, 1.6]


def test_mask_bench_leaves_out_a_3x_straggler_but_not_a_2x_one():
    from unbroken.core.sync import mask_bench

    cm = CostModel(shard_batch=8, redundancy=2)
    out, why = mask_bench([1.0, 3.0, 1.0, 1.0], (), cm)
    assert out == (1,) and "leaves out [1]" in why
    # 2x: the survivor's 2-deep stack takes as long as the wait: no sooner, keep it
    out, why = mask_bench([1.0, 2.0, 1.0, 1.0], (), cm)
    assert out == () and "leaving no straggler out is soonest" in why
    assert mask_bench([1.0, 1.05, 1.0, 1.0], (), cm) == ((), "mask: no straggler predicted")
    # two adjacent stragglers at r = 2 share a type: leaving both out is a wipe-out, so only
    # the slower one goes, and leaving it out must still pay against the other's wait
    out, _ = mask_bench([1.0, 1.0, 1.0, 1.0, 5.0, 4.0, 1.0, 1.0], (), cm)
    assert out == (4,)
    # no redundancy: nothing can be left out
    assert mask_bench([1.0, 3.0, 1.0, 1.0], (), CostModel(redundancy=1))[0] == ()


def test_mask_bench_hysteresis_keeps_a_benched_group_until_it_is_near_the_fastest():
    from unbroken.core.sync import mask_bench

    cm = CostModel(shard_batch=8, redundancy=2, min_gain=0.0)
    # a benched group measured at 1.15x: still over the 1.1x release bar, but leaving it out
    # now costs a 2-deep stack, so it comes back (the estimate, not the flag, decides)
    assert mask_bench([1.0, 1.15, 1.0, 1.0], (1,), cm)[0] == ()
    assert mask_bench([1.0, 2.5, 1.0, 1.0], (1,), cm)[0] == (1,)


def test_select_and_decide_choose_only_allowed_modes_but_estimate_all():
    from unbroken.core.sync import bench_for_mode

    cm = CostModel(shard_batch=8, redundancy=2, noise_scale=0.0)
    t = [1.0, 3.0, 1.0, 1.0]
    assert select(t, cm).mode != "mask"  # with phi = 0 an asynchronous mode is cheapest
    s = select(t, cm, allowed=("sync", "mask"), greedy_mask=True)
    assert s.mode == "mask" and set(s.estimates) == {"sync", "mask", "ksync", "groups", "async"}
    assert s.estimates["mask"].left_out == (1,)
    st = AutoState()
    for _ in range(2):
        d = decide(st, t, cm, allowed=("sync", "mask"), greedy_mask=True)
        st = d.state
    assert d.mode == "mask" and d.switched and bench_for_mode(d, ()) == (1,)
    # unchanged stragglers: no re-selection, the bench in force stays
    d2 = decide(st, t, cm, allowed=("sync", "mask"), greedy_mask=True)
    assert not d2.switched and d2.selection is None and bench_for_mode(d2, (1,)) == (1,)
    # stragglers gone (confirmed twice): back to sync, nobody left out
    for _ in range(2):
        d3 = decide(st, [1.0] * 4, cm, allowed=("sync", "mask"), greedy_mask=True)
        st = d3.state
    assert d3.mode == "sync" and d3.switched and bench_for_mode(d3, (1,)) == ()


def test_ksync_step_defers_the_slowest_and_catches_up_in_balanced_steps():
    from unbroken.core.sync import ksync_step

    t = [1.0, 3.0, 1.1, 0.9]
    s = ksync_step(t, 4, 3, [], last=False)
    assert s.late == (1,) and s.catch_up == ()
    # fewer deferred shards than fast groups: wait; as many: one each, oldest first
    assert ksync_step(t, 4, 3, [(0, 1), (1, 1)], last=False).catch_up == ()
    s = ksync_step(t, 4, 3, [(0, 1), (1, 1), (2, 1), (3, 1)], last=False)
    assert s.catch_up == ((0, 0, 1), (2, 1, 1), (3, 2, 1))
    # K < N/2: each fast group takes ceil((N-K)/K) so the backlog stays bounded
    s = ksync_step(t, 4, 1, [(0, 1), (0, 2), (0, 0), (1, 1)], last=False)
    assert s.late == (0, 1, 2) and s.catch_up == ((3, 0, 1), (3, 0, 2), (3, 0, 0))
    # the last step defers nothing and spreads the whole backlog over every group
    s = ksync_step(t, 4, 3, [(5, 1), (6, 1), (7, 1)], last=True)
    assert s.late == () and s.catch_up == ((0, 5, 1), (1, 6, 1), (2, 7, 1))
    # no prediction yet: every group takes part; K = N: plain sync
    assert ksync_step(None, 4, 3, [], last=False).late == ()
    assert ksync_step(t, 4, 4, [], last=False).late == ()
    with pytest.raises(ValueError, match="k 5 outside"):
        ksync_step(t, 4, 5, [], last=False)


def test_ksync_backlog_stays_under_2n_for_every_k():
    from unbroken.core.sync import ksync_step

    n = 6
    t = [1.0 + i for i in range(n)]
    for k in range(1, n + 1):
        backlog: list = []
        for step in range(50):
            s = ksync_step(t, n, k, backlog, last=False)
            done = {(a, b) for _w, a, b in s.catch_up}
            backlog = [b for b in backlog if b not in done] + [(step, g) for g in s.late]
            assert len(backlog) < 2 * n, (k, step, len(backlog))


def test_drain_step_spreads_the_backlog_over_the_groups_computing():
    from unbroken.core.sync import drain_step

    s = drain_step([(5, 1), (6, 1), (7, 1)], [3, 0])
    assert s.late == () and s.catch_up == ((0, 5, 1), (3, 6, 1), (0, 7, 1))
    assert drain_step([], [0, 1]).catch_up == () and drain_step([(5, 1)], []).catch_up == ()


def test_ksync_as_the_runtime_runs_it_is_priced_by_deferral_not_staleness():
    from unbroken.core.sync import ksync_defer_estimate

    cm = CostModel(shard_batch=8, noise_scale=0.0)
    # one 2x straggler of 4: the three fast groups compute 4 shards between them (4/3 of a
    # shard each, on average) instead of waiting 2 shards' time; nothing stale
    e = ksync_defer_estimate([1.0, 2.0, 1.0, 1.0], 3, cm)
    assert e.tta == pytest.approx(4 / 3) and e.staleness == 0.0
    assert ksync_defer_estimate([1.0, 2.0, 1.0, 1.0], 4, cm).tta == 2.0  # K = N: sync
    # the statistical cost of deferral: none without gradient noise and none when noise
    # dominates (progress per sample is what counts), a little in between
    costs = [ksync_defer_estimate([1.0] * 4, 3, CostModel(shard_batch=8, noise_scale=phi)).tta
             for phi in (0.0, 32.0, 1e9)]
    assert costs[0] == pytest.approx(4 / 3) and costs[2] == pytest.approx(4 / 3, rel=1e-6)
    assert 4 / 3 < costs[1] < 1.1 * 4 / 3
    # the stale model (STAR's k-sync) and the deferral one differ; tta_of follows the model
    t = [1.0, 1.0, 1.0, 3.0]
    defer = CostModel(shard_batch=8, noise_scale=64.0, ksync_defers=True)
    assert tta_of("ksync:3", t, defer) == ksync_defer_estimate(t, 3, defer).tta
    stale = replace(defer, ksync_defers=False)
    assert tta_of("ksync:3", t, stale) != tta_of("ksync:3", t, defer)


def test_groups_sharing_cores_are_priced_at_the_contention_each_mode_leaves():
    from unbroken.core.sync import ksync_defer_estimate, uncontended

    cm = CostModel.for_runtime(8, 2, noise_scale=64.0, cores=2)
    assert (cm.contention(4), cm.contention(3), cm.contention(2), cm.contention(1)) == \
        (2.0, 1.5, 1.0, 1.0)
    assert CostModel().contention(32) == 1.0  # a device per group
    # measured: 4 groups computing on 2 cores, 17 ms of CPU a shard each; group 3 favoured
    # by the scheduler (19 ms), the straggler waiting 17 ms more than its share (a slow
    # device); CPU time unknown for group 2 (a background thread): divided by the contention
    row = uncontended([0.034, 0.051, 0.034, 0.019], [0.017, 0.017, 0.0, 0.017], cm)
    assert row == pytest.approx([0.017, 0.034, 0.017, 0.017])
    # two computing: each had a core of its own; a group that computed nothing stays 0
    assert uncontended([0.017, 0.0, 0.0, 0.017], [0.017, 0, 0, 0.017], cm) == \
        pytest.approx([0.017, 0.0, 0.0, 0.017])
    dev = replace(cm, cores=0)  # a device per group: the walls as measured
    assert uncontended([0.034, 0.0, 0.05, 0.02], [0.01, 0.0, 0.01, 0.01], dev) == \
        [0.034, 0.0, 0.05, 0.02]
    est = estimates(row, cm, greedy_mask=True)
    assert est["sync"].tta == pytest.approx(0.068)  # as measured: everyone computes
    # ksync:2: two groups compute two shards each at full speed (0.034); ksync:3 three
    # groups 4/3 shards each at 1.5x contention (0.034 too, and its varying batch costs)
    k2, k3 = ksync_defer_estimate(row, 2, cm), ksync_defer_estimate(row, 3, cm)
    assert k2.gap == pytest.approx(0.034) and k3.gap == pytest.approx(0.034)
    assert k2.tta < k3.tta and est["ksync"].mode == "ksync:2"
    # with a device per group the same straggler gives ksync:3 (4/3 of a shard)
    assert estimates(row, dev, greedy_mask=True)["ksync"].mode == "ksync:3"
    d = decide(AutoState(), row, cm, confirm=1, allowed=("sync", "mask", "ksync"),
               greedy_mask=True)
    assert d.mode == "ksync:2", d.reason
    with pytest.raises(ValueError, match="cores -1"):
        CostModel(cores=-1)
    from unbroken.core.sync import shared_cores
    assert (shared_cores(4, 2), shared_cores(2, 2), shared_cores(32, 16), shared_cores(4, 0)) \
        == (2, 0, 16, 0)
    # only the compute part of a step is stretched, not the all-reduce
    assert CostModel(cores=2, comm_s=0.1).stretch(1.1, 4) == pytest.approx(2.1)
    assert CostModel(comm_s=0.1).stretch(1.1, 4) == 1.1


def test_auto_chooses_ksync_when_its_deferral_is_predicted_soonest():
    cm = CostModel(shard_batch=8, noise_scale=64.0, redundancy=2, ksync_defers=True)
    allowed = ("sync", "mask", "ksync")
    st = AutoState()
    for t in ([1.0, 2.0, 1.0, 1.0], [1.0, 2.0, 1.0, 1.0]):  # confirmed on two predictions
        d = decide(st, t, cm, allowed=allowed, greedy_mask=True)
        st = d.state
    # 2x: mask is a wash at r = 2 (a 2-deep stack), ksync:3 about 4/3: ksync, with the
    # predicted TTA of every mode in the selection and the reason
    assert d.switched and d.mode == "ksync:3", d.reason
    tta = d.selection.tta()
    assert tta["ksync"] == min(tta[m] for m in allowed) and "ksync:3" in d.reason
    # not allowed: auto stays with what is
    d2 = decide(AutoState(), [1.0, 2.0, 1.0, 1.0], cm, confirm=1, allowed=("sync", "mask"),
                greedy_mask=True)
    assert not d2.mode.startswith("ksync")
    # a spread under 4/3 never makes deferral worth it: sync (within the 20 % straggler bar
    # nothing is even flagged; at 1.3x ksync:3 is not sooner)
    d3 = decide(AutoState(), [1.0, 1.3, 1.0, 1.0], cm, confirm=1, allowed=allowed,
                greedy_mask=True)
    assert d3.mode == "sync", d3.reason
    # the straggler gone: back to sync
    for _ in range(2):
        d = decide(st, [1.0] * 4, cm, allowed=allowed, greedy_mask=True)
        st = d.state
    assert d.mode == "sync" and d.switched


def test_data_step_losses_complete_a_step_when_its_last_shard_is_computed():
    from unbroken.core.sync import data_step_losses

    # step 0: types 0, 2, 3 computed (loss 1 each), type 1 deferred
    done, pend = data_step_losses({}, 0, 3.0, 3, [], 4)
    assert done == {} and pend == {0: (3.0, 3)}
    # step 1: all four of its own, and step 0's type 1 caught up (loss 5)
    done, pend2 = data_step_losses(pend, 1, 8.0, 4, [(0, 5.0)], 4)
    assert done == {0: 2.0, 1: 2.0} and pend2 == {} and pend == {0: (3.0, 3)}


def test_data_step_loss_points_time_a_deferred_step_at_its_completion():
    from unbroken.core.stragglers import data_step_loss_points

    commits = [{"step": 0, "t": 1.0, "loss": 0.5, "data_losses": []},
               {"step": 1, "t": 2.0, "loss": 0.4, "data_losses": [[0, 0.9], [1, 0.7]]},
               {"step": 1, "t": 2.1, "loss": 0.4, "data_losses": [[0, 0.9], [1, 0.7]]},
               {"step": 2, "t": 3.0, "loss": 0.3}]  # a commit of its own step (sync)
    assert data_step_loss_points(commits) == {0: (2.0, 0.9), 1: (2.0, 0.7), 2: (3.0, 0.3)}


# ----------------------------------------------------------------------------- groups / async

def test_async_units_cluster_groups_and_isolate_async():
    from unbroken.core.sync import async_units

    t = [1.0, 3.0, 1.02, 1.05]
    assert async_units(t, "groups") == [(0, 2, 3), (1,)]  # fastest cluster first
    assert async_units(t, "async") == [(0,), (2,), (3,), (1,)]
    assert async_units(t, "groups", live=[1, 2]) == [(2,), (1,)]
    with pytest.raises(ValueError, match="'mask'"):
        async_units(t, "mask")


def test_stream_shard_lags_at_most_the_bound_and_hands_the_rest_to_the_backlog():
    from unbroken.core.sync import stream_shard

    assert stream_shard(5, 7, 4) == (5, [])
    assert stream_shard(1, 9, 4) == (5, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="cursor 8 is ahead of step 7"):
        stream_shard(8, 7)


def test_async_step_runs_the_fastest_cluster_inline_and_the_rest_in_the_background():
    from unbroken.core.sync import Job, async_step

    t = [1.0, 3.0, 1.02, 1.05]
    a = async_step(t, "groups", 5, [5, 5, 5, 5], {}, (), [], range(4))
    assert a.sync == (0, 2, 3) and set(a.start) == {1} and a.start[1] == Job(5, 5, (1,))
    assert a.cursor == (6, 6, 6, 6) and a.deliver == () and a.backlog == ()
    # no prediction yet: every group synchronous
    assert async_step(None, "async", 0, [0] * 4, {}, (), [], range(4)).sync == (0, 1, 2, 3)
    # a lagging stream skips to 4 behind; the skipped shards are caught up by the sync groups
    fl = {1: Job(2, 1, (1,))}
    a = async_step(t, "groups", 9, [10, 2, 10, 10], fl, (), [], range(4))
    assert a.sync == (0, 2, 3) and a.start == {}
    assert a.forced == (1,) and a.deliver == (1,)  # 9 - 2 >= 4: the step waits for it
    b = async_step(t, "groups", 6, [7, 2, 7, 7], {1: Job(5, 1, (1,))}, (), [(0, 1), (1, 1)],
                   range(4))
    assert b.deliver == () and b.catch_up.catch_up == ()  # m = 1 per sync group: not yet 3
    c = async_step(t, "groups", 6, [7, 2, 7, 7], {1: Job(5, 1, (1,))}, (),
                   [(0, 1), (1, 1), (2, 1)], range(4))
    assert sorted(g for g, _s, _t in c.catch_up.catch_up) == [0, 2, 3]
    assert c.backlog == ((0, 1), (1, 1), (2, 1))  # removed at the commit that computes them


def test_a_cluster_delivers_together_once_every_member_said_it_was_done():
    from unbroken.core.sync import Job, async_step, restart_after

    t = [1.0, 3.0, 3.05, 1.0]
    fl = {1: Job(4, 4, (1, 2)), 2: Job(4, 4, (1, 2))}
    a = async_step(t, "groups", 6, [7, 5, 5, 7], fl, (1,), [], range(4))
    assert a.clusters == ((0, 3), (1, 2)) and a.deliver == ()
    a = async_step(t, "groups", 6, [7, 5, 5, 7], fl, (1, 2), [], range(4))
    assert a.deliver == (1, 2)
    # both restart at once on step 6's parameters, together, on their streams' next shard
    assert restart_after(1, fl[1], 6, a, [7, 5, 5, 7]) == (Job(6, 5, (1, 2)), [])
    assert restart_after(2, fl[2], 6, a, [7, 5, 5, 7]) == (Job(6, 5, (1, 2)), [])
    # a job delivered in the step it started is followed at the next boundary; a group now
    # in the fastest cluster becomes synchronous there
    assert restart_after(1, Job(6, 5, (1,)), 6, a, [7, 6, 5, 7]) is None
    assert restart_after(0, Job(4, 3, (0,)), 6, a, [7, 6, 5, 7]) is None


def test_a_step_with_nobody_synchronous_waits_for_the_oldest_job():
    from unbroken.core.sync import Job, async_step

    fl = {0: Job(3, 3, (0,)), 1: Job(2, 2, (1,))}
    a = async_step([1.0, 3.0], "async", 4, [4, 3], fl, (), [], [0, 1])
    assert a.sync == () and a.forced == (1,) and a.deliver == (1,)
