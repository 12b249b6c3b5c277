"""core.changefit: thresholds from healthy evidence only, and the grid's choice: the most early
warnings within the false-alarm budget on the fitting clusters."""

from __future__ import annotations

import numpy as np
import pytest

from unbroken.core.changefit import FitCase, fit_detector, thresholds_at
from unbroken.core.changepoint import ChangePolicy
from unbroken.core.precursors import Failure

T, N = 2880, 6            # one day at 30 s
FAM = {"a": "fa", "b": "fb"}


def _case(seed: int, noise_spikes: int, precursor: float) -> FitCase:
    """Evidence of two signals on 6 nodes: healthy spikes of random height, and node 2 failing
    at scrape 2000 with a precursor rising to ``precursor`` from scrape 1900."""
    rng = np.random.default_rng(seed)
    ev = {s: np.zeros((N, T), np.float32) for s in ("a", "b")}
    for s in ev:
        for _ in range(noise_spikes):
            n, t0 = int(rng.integers(N)), int(rng.integers(T - 30))
            ev[s][n, t0:t0 + 10] = rng.uniform(5, 40)
    ramp = np.linspace(0, precursor, 100)
    ev["a"][2, 1900:2000] = ramp
    ev["b"][2, 1900:2000] = ramp * 0.5
    null = np.ones((N, T), bool)
    null[2, 1700:2300] = False
    t = np.arange(T) * 30.0
    return FitCase(ev, t, [Failure(2, float(t[2000]))], null, early_possible=1)


def test_thresholds_come_from_healthy_evidence_only():
    c = _case(0, 20, precursor=1000.0)
    th = thresholds_at([c], 0.0, min_h=1.0)
    top = float(c.evidence["a"][c.null].max())
    assert top < th["a"] == pytest.approx(top, rel=2e-3)  # a hair above the healthy maximum
    assert th["a"] < 100                                   # the precursor is masked out
    assert thresholds_at([c], 0.0, min_h=500.0)["a"] == 500.0
    lo = thresholds_at([c], 0.01, min_h=0.0)["a"]
    assert lo <= th["a"]


def test_fit_takes_the_most_early_warnings_within_the_budget():
    cases = {(1.0, 6.0): [_case(s, 30, precursor=60.0) for s in range(3)],
             (2.0, 6.0): [_case(s + 10, 30, precursor=35.0) for s in range(3)]}
    pol, rows, why = fit_detector(cases, FAM, budget_per_day=2.0, margin=1.0,
                                  levels=(1e-2, 1e-3, 1e-4, 0.0), pairs=(0.5, 1.0),
                                  min_h_scrapes=0.0)
    assert len(rows) == 2 * 4 * 3 * 2                 # (k, cap) x level x stretch x pair
    ok = [r for r in rows if r.fa_per_day_mean <= 2.0]
    best = max(r.early for r in ok)
    assert best >= 1 and "early precursors warned" in why
    assert (pol.k, pol.cap) in cases and set(pol.thresholds) == {"a", "b"}
    chosen = [r for r in ok if (r.k, r.cap, r.pair) == (pol.k, pol.cap, pol.pair)
              and r.early == best]
    assert chosen                                          # it is one of the best rows
    assert any(r.fa_per_day_mean > 2.0 for r in rows)      # and the budget did bind


def test_nothing_within_budget_takes_the_quietest_and_says_so():
    cases = {(1.0, 6.0): [_case(s, 400, precursor=10.0) for s in range(2)]}
    pol, rows, why = fit_detector(cases, FAM, budget_per_day=0.0, levels=(1e-2, 1e-3),
                                  pairs=(0.5,), min_h_scrapes=0.0)
    assert why.startswith("no setting meets")
    quietest = min(r.fa_per_day_mean for r in rows)
    assert f"{quietest:.2f}/day" in why


def test_bad_budget_and_no_clusters():
    with pytest.raises(ValueError, match="budget"):
        fit_detector({(1.0, 6.0): [_case(0, 1, 1.0)]}, FAM, budget_per_day=-1)
    with pytest.raises(ValueError, match="no fitting clusters"):
        fit_detector({}, FAM, budget_per_day=1.0)
    assert ChangePolicy().check()


def test_false_alarms_are_counted_on_clusters_the_thresholds_did_not_see():
    """At level 0 the threshold is the healthy maximum: scored on its own clusters it would
    never fire. Two-fold, the cluster with the taller healthy spike fires against the other's
    threshold, and the fit says so."""
    a, b = _case(0, 0, precursor=0.0), _case(1, 0, precursor=0.0)
    a.evidence["a"][4, 100:110] = 50.0
    b.evidence["a"][4, 100:110] = 20.0
    _, rows, _ = fit_detector({(1.0, 6.0): [a, b]}, FAM, budget_per_day=1.0, levels=(0.0,),
                              pairs=(1.0,), min_h_scrapes=0.0)
    assert rows[0].fa_per_day_max == pytest.approx(1.0)     # one alarm in one day, on a
    assert rows[0].fa_per_day_mean == pytest.approx(0.5)    # not on b
