"""Warm standby pool: P99 of Binomial(groups, p) (byterobust.md §8), and where p comes from."""

import math

import pytest
from scipy.stats import binom

from unbroken.core.standby import (
    StandbyError,
    p_from_history,
    p_from_mtbf,
    plan_standby,
    standby_size,
)


def test_byterobust_example_four_standbys_for_1024():
    # byterobust.md §8: 4 standbys for 1,024 instances; checked there: p=0.0015 -> 5, 2048 -> 6
    assert standby_size(1024, 0.001) == 4
    assert standby_size(1024, 0.0015) == 5
    assert standby_size(2048, 0.001) == 6


@pytest.mark.parametrize("groups", [1, 2, 7, 64, 600, 1024])
@pytest.mark.parametrize("p", [0.0, 1e-4, 0.003, 0.05, 0.5, 0.97, 1.0])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
def test_equals_scipy_ppf_and_is_the_smallest_k_covering_q(groups, p, q):
    k = standby_size(groups, p, q)
    assert k == int(binom.ppf(q, groups, p))
    assert 0 <= k <= groups
    assert binom.cdf(k, groups, p) >= q - 1e-12
    if k > 0:
        assert binom.cdf(k - 1, groups, p) < q


def test_monotone_in_p_and_in_groups():
    ps = [i / 200 for i in range(201)]
    sizes = [standby_size(600, p) for p in ps]
    assert sizes == sorted(sizes) and sizes[0] == 0 and sizes[-1] == 600
    by_groups = [standby_size(g, 0.01) for g in range(1, 400, 7)]
    assert by_groups == sorted(by_groups)


def test_plan_reason_names_size_and_cover():
    k, why = plan_standby(1024, 0.001)
    assert k == 4 and why.startswith("4 standbys for 1024 groups") and "\n" not in why


def test_p_from_history_and_mtbf():
    assert p_from_history(0, 100) == 0.0
    assert p_from_history(3, 6400) == 3 / 6400
    assert p_from_history(5, 5) == 1.0
    assert p_from_mtbf(3600.0, 3600.0) == pytest.approx(1 - math.exp(-1))
    assert p_from_mtbf(1e9, 1.0) == pytest.approx(1e-9)  # expm1: no cancellation
    assert standby_size(1024, p_from_history(1, 1000)) == 4


@pytest.mark.parametrize("call, word", [
    (lambda: standby_size(0, 0.1), "groups=0"),
    (lambda: standby_size(2.5, 0.1), "groups=2.5"),
    (lambda: standby_size(10, -0.1), "p=-0.1"),
    (lambda: standby_size(10, 1.5), "p=1.5"),
    (lambda: standby_size(10, float("nan")), "p=nan"),
    (lambda: standby_size(10, 0.1, 0.0), "quantile=0.0"),
    (lambda: standby_size(10, 0.1, 1.01), "quantile=1.01"),
    (lambda: p_from_history(-1, 10), "failures=-1"),
    (lambda: p_from_history(1, 0), "group_intervals=0"),
    (lambda: p_from_history(11, 10), "failures=11 exceeds group_intervals=10"),
    (lambda: p_from_mtbf(0.0, 1.0), "group_mtbf=0.0"),
    (lambda: p_from_mtbf(1.0, -2.0), "window=-2.0"),
])
def test_bad_inputs_raise_one_line_naming_the_value(call, word):
    with pytest.raises(StandbyError) as ei:
        call()
    assert word in str(ei.value) and "\n" not in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_refill_tops_the_warm_pool_up_to_its_target():
    from unbroken.core.standby import refill

    assert refill(0) == 1 and refill(1) == 0 and refill(3) == 0
    assert refill(1, target=4) == 3
