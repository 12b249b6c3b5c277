"""Retry backoff: growth and cap, seeded jitter, bad policies (the ladder's requeue uses it)."""

import pytest

from unbroken.core.retry import RetryPolicy, RetryPolicyError, backoff_delay

NO_JITTER = RetryPolicy(jitter=0.0)


def backoff_schedule(n, policy, seed=0):
    return [backoff_delay(a, policy, seed) for a in range(n)]


def test_defaults_follow_the_report():
    p = RetryPolicy()
    assert p.base == 600.0  # backendai.md §7: 10-min delay
    assert p.factor == 2.0  # "10·2^a min capped"


def test_backoff_grows_then_caps_without_jitter():
    assert backoff_schedule(7, NO_JITTER) == [600.0, 1200.0, 2400.0, 3600.0, 3600.0, 3600.0,
                                              3600.0]
    assert backoff_delay(10_000, NO_JITTER) == 3600.0  # no overflow far past the cap
    fixed = RetryPolicy(factor=1.0, max_delay=600.0, jitter=0.0)
    assert backoff_schedule(4, fixed) == [600.0] * 4  # the report's fixed 10-min chains


def test_jitter_is_seeded_bounded_and_only_shortens():
    p = RetryPolicy(jitter=0.1)
    a = backoff_schedule(8, p, seed=7)
    assert a == backoff_schedule(8, p, seed=7)  # same seed, same schedule
    assert a != backoff_schedule(8, p, seed=8)
    raw = backoff_schedule(8, NO_JITTER)
    for d, r in zip(a, raw):
        assert 0.9 * r < d <= r <= p.max_delay
    assert a[3] == backoff_delay(3, p, seed=7)  # one delay recomputable on its own
    assert max(backoff_schedule(50, p, seed=1)) <= p.max_delay


@pytest.mark.parametrize("kwargs, words", [
    ({"base": 0}, ["base=0"]),
    ({"base": -5.0}, ["base=-5.0"]),
    ({"max_delay": 100.0}, ["max_delay=100.0", "base=600.0"]),
    ({"factor": 0.5}, ["factor=0.5"]),
    ({"jitter": 1.0}, ["jitter=1.0"]),
    ({"jitter": -0.1}, ["jitter=-0.1"]),
    ({"base": float("nan")}, ["base=nan"]),
    ({"max_delay": "1h"}, ["max_delay='1h'"]),
])
def test_impossible_policies_raise_one_line(kwargs, words):
    with pytest.raises(RetryPolicyError) as ei:
        RetryPolicy(**kwargs)
    msg = str(ei.value)
    assert "\n" not in msg and isinstance(ei.value, ValueError)
    for w in words:
        assert w in msg



def test_bad_index_or_seed_raises_one_line():
    for bad in (-1, 1.5, True):
        with pytest.raises(RetryPolicyError, match="retry index"):
            backoff_delay(bad)
    with pytest.raises(RetryPolicyError, match="seed"):
        backoff_delay(0, seed="x")
