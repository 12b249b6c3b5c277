"""Physical properties of the simulator over random scenarios (hypothesis, derandomized).

Failures can only cost time: without jitter a run with failures never finishes before the
same run without them (with jitter: never before a machine with neither), and a shorter MTBF
never lowers the expected time-to-train. Both failed for the authors'
shortcut (a step answered in the controller's fixed phase committed after half an all-reduce),
which ``Scenario.paper_shortcut`` keeps as an option; the default model must hold them.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from unbroken.core import placement
from unbroken.core.scenario import Scenario
from unbroken.sim.engine import simulate

FAILURE_FREE_MTBF = 1e12   # seconds: no failure within any of these runs

_settings = settings(max_examples=15, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw, jitter: bool):
    n = draw(st.integers(20, 160))
    strategy = draw(st.sampled_from(["spare", "spare", "rep"]))
    top = placement.max_redundancy(n) if strategy == "spare" else min(n, 6)
    r = draw(st.integers(2, max(2, min(top, 8))))
    sc = Scenario(
        groups=n, gpus=n * 8, steps=draw(st.integers(30, 100)),
        t_compute=draw(st.floats(1.0, 100.0)),
        t_allreduce=draw(st.floats(0.1, 2000.0)),
        mtbf=draw(st.floats(20.0, 5000.0)),
        t_restart=draw(st.floats(0.0, 7200.0)),
        t_save=draw(st.floats(0.0, 120.0)),
        jitter=draw(st.floats(0.0, 0.1)) if jitter else 0.0,
        fail_dist=draw(st.sampled_from(["weibull", "exponential"])),
        weibull_shape=draw(st.floats(0.5, 1.5)))
    return sc, strategy, r, draw(st.integers(1, 20)), draw(st.integers(0, 2 ** 16))


@pytest.mark.slow
@_settings
@given(scenarios(jitter=False))
def test_failures_never_beat_the_failure_free_run(case):
    """Per seed and exact: without jitter every committed step costs at least its compute
    and one whole all-reduce, and restarts, rollbacks and retries only add."""
    sc, strategy, r, k, seed = case
    with_f = simulate(sc, strategy, r, seed=seed, ckpt_every=k, max_ttt_over_t0=20)
    free = simulate(sc.with_(mtbf=FAILURE_FREE_MTBF), strategy, r, seed=seed, ckpt_every=k)
    assert free.masked_failures == free.wipeouts == 0
    assert with_f.wall_clock_s >= free.wall_clock_s * (1 - 1e-12)


@pytest.mark.slow
@_settings
@given(scenarios(jitter=True))
def test_failures_with_jitter_never_beat_a_failure_free_machine_without_jitter(case):
    """With jitter, per seed: a run with failures never finishes before the same job on a
    machine with neither failures nor jitter. Every committed step still costs its compute
    and a whole all-reduce, and the slowest of the live groups is never faster than the
    jitter-free compute (the max of >= 10 normals is below 0 once in ~1,000 steps, by a
    hair; hence the 1e-6).

    What is *not* claimed: that failures never beat the failure-free run with the same jitter.
    That is false in the model and can be so on a machine: a masked failure leaves fewer
    groups to wait for, and where the smaller straggler saves more than the failure cost (1.5
    T_a plus the shrink, cheap at a short all-reduce), more failures really do train faster
    (rep r=4, T_a = 0.1 s, 87 s steps: the mean over 200 seeds falls from 11,759 s failure-free
    to 11,755 s at 7 masked failures). This test stated that until 2026-12-07 and passed by
    the examples hypothesis drew. The weaker claim still separates the models: under
    ``paper_shortcut`` it failed in 57 of 150 random scenarios of this domain (numpy seed 0,
    checkpoint every 5 steps), the default model in none."""
    sc, strategy, r, k, seed = case
    with_f = simulate(sc, strategy, r, seed=seed, ckpt_every=k, max_ttt_over_t0=20)
    ideal = simulate(sc.with_(mtbf=FAILURE_FREE_MTBF, jitter=0.0), strategy, r, seed=seed,
                     ckpt_every=k)
    assert ideal.masked_failures == ideal.wipeouts == 0
    assert with_f.wall_clock_s >= ideal.wall_clock_s * (1 - 1e-6)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(jitter=False), st.floats(1.0, 50.0), st.floats(2.0, 8.0))
def test_shorter_mtbf_never_lowers_expected_ttt(case, steps_per_failure, factor):
    """MTBF m against m * factor (factor >= 2), same checkpoint interval and seeds: the mean
    TTT over 10 seeds may not fall by more than 3 standard errors of the paired difference.

    An expectation, not a per-seed order. Common random numbers couple the two runs only up to
    each group's first failure: later intervals come off one stream in the order failures are
    noticed and start at the check point that noticed them, and a restart resets the layout
    and depth, so one seed's shorter-MTBF run can come out faster (the first hypothesis
    example that showed it, SPARe r=2 at 5 steps per failure, Weibull 0.5: 1.954 against
    1.957 over seeds 0-4, but 1.989 against 1.884 over 400 seeds). Which examples hypothesis
    draws also shifts with the modules a process has imported (it mixes constants from local
    source into its draws even derandomized), so a strict order on a few seeds passed or
    failed by which test files ran beside it.

    The domain, and why: the MTBF is at least one failure-free step (the domain of the
    closed forms, ``theory.caveats``): below it almost every all-reduce breaks and what a
    failure costs depends on where the check points fall, not on how many there are. No
    jitter: with it a masked failure leaves fewer groups to wait for, and where that smaller
    straggler saves more than the failure costs (1.5 T_a + shrink, cheap at a short
    all-reduce) more failures really do train faster (rep r=4, T_a = 0.1 s, 87 s steps: the
    mean over 200 seeds falls from 11,759 s failure-free to 11,755 s at 7 masked failures).
    Only completed runs: a run stopped at the cap has a floor, not a TTT. The shortcut still
    fails this (a masked step then costs less than a whole all-reduce)."""
    sc, strategy, r, k, seed = case
    sc = sc.with_(mtbf=(sc.t_compute + sc.allreduce) * steps_per_failure)
    seeds = range(seed, seed + 10)

    def ttts(s: Scenario) -> np.ndarray:
        runs = [simulate(s, strategy, r, seed=x, ckpt_every=k, max_ttt_over_t0=20)
                for x in seeds]
        assume(all(run.completed for run in runs))
        return np.array([run.ttt_over_t0 for run in runs])

    short, long_ = ttts(sc), ttts(sc.with_(mtbf=sc.mtbf * factor))
    d = short - long_
    assert d.mean() >= -3 * d.std(ddof=1) / np.sqrt(d.size) - 1e-9 * long_.mean()


def test_the_paper_shortcut_does_beat_failure_free_at_a_long_allreduce():
    """Why the shortcut is not the default: with T_a >> T_compute, committing after half an
    all-reduce makes the run with failures faster than the one without."""
    sc = Scenario(groups=200, gpus=2000, steps=60, t_compute=10.0, t_allreduce=600.0,
                  mtbf=2000.0, jitter=0.0, paper_shortcut=True)
    free = simulate(sc.with_(mtbf=FAILURE_FREE_MTBF), "spare", 12, seed=0, ckpt_every=20)
    short = simulate(sc, "spare", 12, seed=0, ckpt_every=20)
    honest = simulate(sc.with_(paper_shortcut=False), "spare", 12, seed=0, ckpt_every=20)
    assert short.controller_phases.get("fixed", 0) > 0
    assert short.wall_clock_s < free.wall_clock_s <= honest.wall_clock_s


@pytest.mark.parametrize("strategy,r", [("spare", 6), ("rep", 3)])
def test_a_masked_failure_costs_the_broken_half_and_the_shrink_then_a_whole_retry(strategy, r):
    """One failure, exactly accounted: the step pays 0.5 T_a for the all-reduce that broke,
    0.1 s of shrink and then a whole all-reduce again, so it costs 0.5 T_a + 0.1 s more than
    a failure-free step (SPARe at depth 1 must also patch-compute one stack: 64 s)."""
    base = Scenario(groups=200, gpus=2000, steps=30, t_allreduce=10.0, jitter=0.0,
                    mtbf=FAILURE_FREE_MTBF)
    free = simulate(base, strategy, r, seed=0, ckpt_every=100)
    for mtbf in np.geomspace(300.0, 30000.0, 60):   # find an MTBF whose seed-0 run fails once
        res = simulate(base.with_(mtbf=float(mtbf), fail_dist="exponential"), strategy, r,
                       seed=0, ckpt_every=100)
        if res.masked_failures == 1 and res.wipeouts == 0:
            break
    else:
        raise AssertionError("no single-failure run in the grid")
    extra = res.wall_clock_s - free.wall_clock_s
    if strategy == "spare":
        # the failure raised the depth to 2: one more stack in every later step
        later = round((res.mean_stack_depth - 1.0) * res.committed_steps)
        extra -= later * 64.0 + 64.0
    assert extra == pytest.approx(0.5 * 10.0 + 0.1, abs=1e-6)
