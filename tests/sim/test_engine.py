import dataclasses

import numpy as np
import pytest

from unbroken.core import theory
from unbroken.core.placement import PlacementError
from unbroken.core.scenario import Scenario, ScenarioError
from unbroken.sim.engine import simulate, validate
from unbroken.sim.sweep import Job, run_jobs, summarize

PAPER = Scenario()  # N = 600, 600k GPUs, MTBF 5 min (Weibull 0.78), T_r 60 min, save 60 s


def _mean(results, key):
    return float(np.mean([getattr(r, key) for r in results]))


def test_same_seed_same_run_and_other_seeds_differ():
    sc = Scenario(groups=200, steps=1500)
    a = simulate(sc, "spare", 6, seed=3)
    b = simulate(sc, "spare", 6, seed=3)
    c = simulate(sc, "spare", 6, seed=4)
    assert a == b
    assert a.wall_clock_s != c.wall_clock_s


@pytest.mark.mp  # a process pool
def test_parallel_sweep_equals_serial():
    sc = Scenario(groups=200, steps=800)
    jobs = [Job("spare", 4, s) for s in range(2)] + [Job("rep", 3, 0)]
    assert run_jobs(sc, jobs, workers=2) == run_jobs(sc, jobs, workers=1)


def test_without_failures_time_is_compute_plus_allreduce_and_checkpoints():
    sc = Scenario(groups=200, steps=200, mtbf=1e15, jitter=0.0)
    r = simulate(sc, "spare", 4, seed=0, ckpt_every=50)
    assert r.wipeouts == 0 and r.masked_failures == 0 and r.mean_stack_depth == 1
    assert r.wall_clock_s == pytest.approx(200 * (64 + 2) + 4 * 60)
    assert r.availability == 1.0
    rep = simulate(sc, "rep", 3, seed=0, ckpt_every=50)
    assert rep.wall_clock_s == pytest.approx(200 * (3 * 64 + 2) + 4 * 60)


def test_fidelity_replication_r3_at_n600():
    """Published: Rep+CKPT (r = 3) TTT/T0 = 4.27 with 79.89% availability."""
    res = [simulate(PAPER, "rep", 3, seed=s) for s in range(5)]
    assert _mean(res, "ttt_over_t0") == pytest.approx(4.27, rel=0.05)
    assert _mean(res, "availability") == pytest.approx(0.7989, abs=0.02)


@pytest.mark.slow
def test_fidelity_spare_r8_at_n600():
    """Published: SPARe+CKPT (r = 8) TTT/T0 = 2.49 with 93.90% availability."""
    res = [simulate(PAPER, "spare", 8, seed=s) for s in range(5)]
    assert _mean(res, "ttt_over_t0") == pytest.approx(2.49, rel=0.05)
    assert _mean(res, "availability") == pytest.approx(0.9390, abs=0.02)
    # The stack depth the controller runs at agrees with the closed form.
    assert _mean(res, "mean_stack_depth") == pytest.approx(
        theory.overhead_lower_bound(600, 8), rel=0.02)


@pytest.mark.mp  # a process pool of two
@pytest.mark.parametrize("n,seeds", [(600, 10), (200, 40)])
def test_simulated_mu_agrees_with_theory(n, seeds):
    """Pooled over hundreds to thousands of restart epochs (the per-epoch spread is ~30%)."""
    sc = Scenario(groups=n)
    res = run_jobs(sc, [Job("spare", 4, s) for s in range(seeds)], workers=2)
    fatal = sum(r.failures_per_wipeout * r.wipeouts for r in res)
    mu_sim = fatal / sum(r.wipeouts for r in res)
    assert mu_sim == pytest.approx(theory.mu(n, 4), rel=0.03)


def test_spare_masks_what_replication_cannot():
    sc = Scenario(groups=200, steps=2000)
    sp = simulate(sc, "spare", 4, seed=1)
    rep = simulate(sc, "rep", 4, seed=1)
    assert sp.masked_failures > 0 and sp.controller_phases.get("mcmf", 0) > 0
    assert sp.ttt_over_t0 < rep.ttt_over_t0


def test_checkpoint_only_is_capped_and_says_so():
    r = simulate(Scenario(steps=100), "ckpt", seed=0, max_ttt_over_t0=5)
    assert not r.completed
    assert r.ttt_over_t0 >= 5
    assert r.availability < 0.2


def test_exponential_failures_run_too():
    sc = Scenario(groups=200, steps=1000, fail_dist="exponential")
    r = simulate(sc, "spare", 6, seed=0)
    assert r.completed and r.masked_failures > 0


def test_summary_is_the_mean_over_seeds():
    sc = Scenario(groups=200, steps=500)
    res = [simulate(sc, "spare", 4, seed=s) for s in range(3)]
    s = summarize(res)
    assert s["ttt_over_t0"] == pytest.approx(_mean(res, "ttt_over_t0"))
    assert len(s["per_seed"]) == 3
    assert s["ttt_over_t0_min"] <= s["ttt_over_t0"] <= s["ttt_over_t0_max"]


def test_bad_configurations_are_named():
    with pytest.raises(ValueError, match="'bogus'"):
        validate(PAPER, "bogus", 3)
    with pytest.raises(PlacementError, match="200"):
        validate(Scenario(groups=200), "spare", 13)
    with pytest.raises(ScenarioError, match="groups"):
        Scenario(groups=0)
    with pytest.raises(ScenarioError, match="fewer than groups"):
        Scenario(groups=600, gpus=10)
    with pytest.raises(ScenarioError, match="'gamma'"):
        dataclasses.replace(PAPER, fail_dist="gamma")


def test_the_simulator_charges_the_first_rank_failure_to_the_group():
    # a group's failure intervals are the minima of its ranks' draws: their mean is the
    # scenario's group MTBF (R^(1 - 1/k) of R = 1's for Weibull), and R = 1 draws exactly the
    # intervals it drew before ranks existed
    import numpy as np

    from unbroken.sim.engine import _Draws

    for r in (1, 4):
        sc = Scenario(groups=50, gpus=1000, ranks_per_group=r)
        iv = _Draws(sc, 3).intervals(40_000)
        assert abs(iv.mean() / sc.group_mtbf - 1) < 0.03, (r, iv.mean(), sc.group_mtbf)
    base = _Draws(Scenario(groups=50, gpus=1000), 3).intervals(5)
    legacy = np.random.default_rng(np.random.SeedSequence(3).spawn(2)[0]).weibull(0.78, 5)
    assert np.array_equal(base, legacy * Scenario(groups=50, gpus=1000).weibull_scale)
