"""The change detector on shapes and data it was not fitted on: fitted on some precursor families,
scored on another; thresholds from one generator's healthy data, scored on its failures."""

from __future__ import annotations

import numpy as np
import pytest

from unbroken.core import changepoint as C
from unbroken.core.changefit import FitCase, thresholds_at
from unbroken.core.precursors import Failure, score
from unbroken.learn.evidence import synth_cases
from unbroken.learn.fit import FitSpec, cluster_spec, fit, generate_fitting
from unbroken.learn.signals import SIGNALS

SMALL = dict(nodes=12, days=2.0, gpus=4, failures=5, early=2, silent=1)
FAMILY_OF = {k: v[0] for k, v in SIGNALS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("held_out", ["drift"])
def test_fitted_without_a_family_it_still_warns_on_it(held_out):
    """Fitted on the other five families (two seeds each), scored on two clusters of the
    held-out family: every cluster gets an early warning for at least one of its two early
    precursors, the silent failure never counts as warned early, and false alarms stay near
    the budget."""
    others = tuple(f for f in ("report", "step", "drift", "oscillation", "burst", "single")
                   if f != held_out)
    det = fit(FitSpec(families=others, seeds=(2000, 2001), budget_per_day=1.0, **SMALL),
              rules=False)
    assert held_out not in det.fitted_on["families"]
    pol = det.policy
    for seed in (2100, 2101):
        s = generate_fitting(cluster_spec(held_out, seed, **SMALL))
        c = synth_cases(s, pol, [(pol.k, pol.cap)])[(pol.k, pol.cap)]
        sc = score(C.combine(c.evidence, FAMILY_OF, pol), c.t, c.failures)
        roles = [f["role"] for f in s.truth["failures"]]
        early = [i for i, x in enumerate(sc.lead_s) if x is not None and x > 0]
        assert any(roles[i] == "early" for i in early), (seed, roles, sc.lead_s)
        assert all(roles[i] != "silent" for i in early)
        assert sc.n_detected >= 3
        assert sc.false_alarms_per_day <= 1.5


def _other_generator(seed, U=24, T=4 * 2880, shapes=()):
    """Not the synth: random-walk cluster level, Student-t noise, per-unit scale, no daily
    cycle, one unit per node; ``shapes``: (unit, start, kind)."""
    rng = np.random.default_rng(seed)
    level = 100 * np.exp(np.cumsum(rng.normal(0, 0.002, T)))
    x = level * rng.lognormal(0, 0.03, (U, 1)) * (1 + 0.02 * rng.standard_t(3, (U, T)))
    t = np.arange(T)
    for (u, at, kind) in shapes:
        on = t >= at
        if kind == "drift":          # 15 % over four hours (the noise: 3.5 % a scrape)
            x[u, on] *= 1 + 0.15 * np.minimum((t[on] - at) / 480, 1)
        elif kind == "oscillation":  # +-10 % with a 5-minute period
            x[u, on] *= 1 + 0.10 * np.sin(2 * np.pi * (t[on] - at) / 10)
    return x


def test_thresholds_from_one_generator_hold_on_its_other_runs():
    """Thresholds from a healthy run of a generator the detector was never written for; on other
    runs, a drift and an oscillation it has not seen are found before their "failure", and the
    healthy units stay quiet."""
    pol = C.ChangePolicy(k=1.0, cap=6.0, pair=1.0)      # the fit grid's smallest allowance
    U, T = 24, 4 * 2880
    live = np.ones((U, T), bool)
    ident = {"s": np.arange(U)}
    t = np.arange(T) * 30.0

    def evidence(x):
        return C.detect_change({"s": x}, ident, live, {"s": 0.0}, {"s": "both"}, {"s": "s"},
                               pol.with_thresholds({"s": 1.0}))[1]

    healthy = [FitCase(evidence(_other_generator(s)), t, [], live) for s in (10, 11)]
    th = thresholds_at(healthy, 1e-5, min_h=3 * (pol.cap - pol.k))
    shapes = [(3, 6000, "drift"), (9, 8000, "oscillation")]
    x = _other_generator(12, shapes=shapes)
    det, _ = C.detect_change({"s": x}, ident, live, {"s": 0.0}, {"s": "both"}, {"s": "s"},
                             pol.with_thresholds(th))
    fails = [Failure(u, t[at + 480]) for (u, at, _) in shapes]    # "XID" 4 h after the onset
    sc = score(det, t, fails)
    assert sc.before_xid == 2
    assert sc.false_alarms_per_day <= 1.0
