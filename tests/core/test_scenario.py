"""The scenario refuses what no cluster has, naming the value and the range."""

import pytest

from unbroken.core.scenario import LIMITS, Scenario, ScenarioError


def _make(name, v):
    """A scenario with one field set (groups and gpus move together: gpus >= groups)."""
    if name == "groups":
        return Scenario(groups=v, gpus=max(v, 600_000))
    if name == "gpus":
        return Scenario(gpus=v, groups=1)
    return Scenario(**{name: v})


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_every_limit_accepts_its_edges_and_refuses_beyond(name):
    lo, hi, _unit, why = LIMITS[name]
    ints = name in ("groups", "gpus", "steps")
    cast = int if ints else float
    _make(name, cast(lo))
    if name != "jitter":                       # jitter's range is open above
        _make(name, cast(hi))
    beyond = int(hi) + 1 if ints else (hi if name == "jitter" else hi * 1.001)
    with pytest.raises(ScenarioError, match=f"^{name} .*outside") as e:
        _make(name, beyond)
    assert why in str(e.value)
    if lo > 0 and not ints:
        with pytest.raises(ScenarioError, match=f"^{name} .*outside"):
            _make(name, lo / 2)


def test_the_issue_values_are_refused():
    with pytest.raises(ScenarioError, match="mtbf 1e-300 s outside"):
        Scenario(mtbf=1e-300)
    with pytest.raises(ScenarioError, match="t_restart 1e\\+300 s outside"):
        Scenario(t_restart=1e300)
    with pytest.raises(ScenarioError, match="finite"):
        Scenario(t_save=float("inf"))


def test_a_groups_failures_are_the_first_of_its_ranks():
    import math

    # exponential: the first of R ranks of mean m R fails at mean m, the group's as before
    one = Scenario(fail_dist="exponential")
    assert Scenario(fail_dist="exponential", ranks_per_group=8).group_mtbf == one.group_mtbf
    # Weibull k < 1: fresh ranks fail early, so a group of R fails more than R times as often
    # as one rank: mean = m N R^(1 - 1/k)
    k = 0.78
    sc = Scenario(ranks_per_group=8, weibull_shape=k)
    assert math.isclose(sc.group_mtbf, sc.mtbf * sc.groups * 8 ** (1 - 1 / k), rel_tol=1e-12)
    assert sc.rank_mtbf == sc.mtbf * sc.groups * 8
    assert Scenario().group_mtbf == Scenario().mtbf * Scenario().groups  # R = 1: as before


def test_every_rank_needs_a_gpu():
    with pytest.raises(ScenarioError, match="^ranks_per_group 8 x groups 600 = 4800 ranks, "
                                            "more than gpus 4000"):
        Scenario(gpus=4000, ranks_per_group=8)
    with pytest.raises(ScenarioError, match="ranks_per_group must be a positive integer"):
        Scenario(ranks_per_group=0)
