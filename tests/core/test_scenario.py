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
