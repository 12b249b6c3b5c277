"""The peer-band detector (``core.precursors``, what ``learn rules`` writes as PromQL): its
statistics against brute force, persistence, families, peers, and its calibration on data from
another generator. The analysis's change detector is tested in tests/core/test_changepoint.py
and tests/learn/test_heldout.py."""

from __future__ import annotations

import numpy as np
import pytest

from unbroken.core import precursors as P


def test_leave_one_out_band_matches_brute_force():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, 40)) * rng.uniform(0.5, 2, size=(9, 1))
    live = rng.random((9, 40)) > 0.2
    pol = P.DetectorPolicy(z=1.0, min_peers=3)
    st = P.peer_stats(x, live, pol)
    for n in range(9):
        for t in range(40):
            peers = x[[m for m in range(9) if m != n and live[m, t]], t]
            if not live[n, t] or len(peers) < 3:
                assert not st.outside[n, t]
                continue
            lo, hi = np.percentile(peers, [5, 95])
            assert st.outside[n, t] == (x[n, t] < lo or x[n, t] > hi)
            vals = x[live[:, t], t]
            mad = 1.4826 * np.median(np.abs(vals - np.median(vals)))
            scale = max(mad, 0.05 * abs(np.median(vals)))
            assert st.z[n, t] == pytest.approx((x[n, t] - np.median(peers)) / scale)


def test_run_lengths_match_a_loop():
    rng = np.random.default_rng(1)
    f = rng.random((3, 50)) > 0.4
    got = P.run_lengths(f)
    for n in range(3):
        run = 0
        for t in range(50):
            run = run + 1 if f[n, t] else 0
            assert got[n, t] == run


def _two_family_collapse(nodes=8, T=200, at=100, dur=20, live_nodes=None):
    rng = np.random.default_rng(2)
    a = 100 + rng.normal(0, 1, (nodes, T))
    b = 50 + rng.normal(0, 1, (nodes, T))
    a[0, at:at + dur] = 20
    b[0, at:at + dur] = 5
    live = np.ones((nodes, T), bool)
    if live_nodes is not None:
        live[live_nodes:] = False
    return {"a": a, "b": b}, {"a": "fa", "b": "fb"}, live


def test_alert_needs_persistence_two_families_and_three_peers():
    sig, fam, live = _two_family_collapse()
    pol = P.DetectorPolicy(z=4, persist=5, families=2)
    st = {k: P.peer_stats(v, live, pol) for k, v in sig.items()}
    det = P.detect(st, fam, pol)
    assert det.alert[0].any() and not det.alert[1:].any()
    assert np.flatnonzero(det.alert[0])[0] == 100 + 5 - 1      # persistence delays the alert
    one = P.detect({"a": st["a"]}, {"a": "fa"}, pol)
    assert not one.alert.any()                                  # one family is not enough
    sig, fam, live = _two_family_collapse(live_nodes=3)         # a node and 2 peers
    st = {k: P.peer_stats(v, live, pol) for k, v in sig.items()}
    assert not P.detect(st, fam, pol).alert.any()


def _other_generator(seed, nodes=20, T=5760, failures=()):
    """Not the synth: random-walk baselines, Student-t noise, per-node scale, no diurnal
    cycle, one spike family the synth does not have. Failures collapse two families."""
    rng = np.random.default_rng(seed)
    sig = {}
    for name, level in (("cpu", 100.0), ("net", 40.0), ("disk", 10.0), ("mem", 70.0)):
        walk = np.cumsum(rng.normal(0, 0.002, T)) + 1
        scale = rng.lognormal(0, 0.05, (nodes, 1))
        sig[name] = level * walk * scale * (1 + 0.03 * rng.standard_t(3, (nodes, T)))
    for (n, at) in failures:
        sig["cpu"][n, at:at + 30] *= 0.3
        sig["net"][n, at:at + 30] *= 0.2
    fam = {k: k for k in sig}
    return sig, fam


def test_other_generator_detected_within_budget():
    pol0 = P.DetectorPolicy()
    healthy, fam = _other_generator(50)
    live = np.ones_like(healthy["cpu"], bool)
    t = np.arange(healthy["cpu"].shape[1]) * 30.0
    st = {k: P.peer_stats(v, live, pol0) for k, v in healthy.items()}
    pol, _, _ = P.calibrate(st, fam, t, budget_per_day=1.0)
    fails = [(3, 1000), (7, 3000), (12, 5000)]
    sig, fam = _other_generator(51, failures=fails)
    st = {k: P.peer_stats(v, live, pol) for k, v in sig.items()}
    sc = P.score(P.detect(st, fam, pol), t, [P.Failure(n, t[a]) for n, a in fails])
    assert sc.n_detected == 3
    assert sc.false_alarms_per_day <= 2.0
