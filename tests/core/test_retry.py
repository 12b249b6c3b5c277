"""Auto-retry chains: backoff growth and cap, seeded jitter, the no-progress guard, the budget."""

import pytest

from unbroken.core.retry import (
    EXIT_NO_PROGRESS,
    Attempt,
    GiveUp,
    Retry,
    RetryPolicy,
    RetryPolicyError,
    backoff_delay,
    backoff_schedule,
    next_retry,
    no_progress_streak,
)

NO_JITTER = RetryPolicy(jitter=0.0)


def test_exit_code_is_distinct_from_the_taken_ones():
    assert EXIT_NO_PROGRESS == 6 and EXIT_NO_PROGRESS not in (0, 1, 2, 3, 4, 5)
    assert GiveUp("budget").exit_code == EXIT_NO_PROGRESS


def test_defaults_follow_the_report():
    p = RetryPolicy()
    assert p.base == 600.0  # backendai.md §7: 10-min delay
    assert p.factor == 2.0  # "10·2^a min capped"
    assert p.max_retries + 1 == 6  # about 6 attempts per chain (73 / 12)


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
    ({"max_retries": -1}, ["max_retries=-1"]),
    ({"no_progress_limit": 0}, ["no_progress_limit=0"]),
    ({"max_retries": 2.5}, ["max_retries=2.5"]),
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


def _chain(*steps, t0=0.0, gap=1000.0):
    """Attempts failing every ``gap`` s; each resumes from the checkpoint at 0 and reaches s."""
    return [Attempt(failed_at=t0 + i * gap, start_step=0, reached_step=s)
            for i, s in enumerate(steps)]


def test_first_retry_after_base_delay():
    d, why = next_retry(_chain(50), now=0.0, policy=NO_JITTER)
    assert d == Retry(at=600.0, delay=600.0, retry=1)
    assert "retry 1/5" in why and "\n" not in why


def test_retry_time_follows_the_schedule_and_late_decisions_go_now():
    p = RetryPolicy(jitter=0.1)
    hist = _chain(10, 20, 30)
    d, _ = next_retry(hist, now=2000.0, policy=p, seed=3)
    assert d.retry == 3 and d.delay == backoff_delay(2, p, seed=3)
    assert d.at == pytest.approx(2000.0 + d.delay)
    d, _ = next_retry(hist, now=99999.0, policy=p, seed=3)
    assert d.at == 99999.0


@pytest.mark.parametrize("limit", [1, 2, 3, 4])
def test_no_progress_guard_fires_exactly_at_the_limit(limit):
    p = RetryPolicy(jitter=0.0, no_progress_limit=limit, max_retries=100)
    hist = [Attempt(0.0, 0, 100)]  # the original run got to step 100
    for k in range(1, limit):
        # restart from the checkpoint at 80, fail before passing 100: no progress
        hist.append(Attempt(float(k), 80, 95 + k))
        d, why = next_retry(hist, now=float(k), policy=p)
        assert isinstance(d, Retry), why
        assert no_progress_streak(hist) == k
    hist.append(Attempt(float(limit), 80, 100))  # equal to the best is not progress
    d, why = next_retry(hist, now=float(limit), policy=p)
    assert d == GiveUp("no_progress")
    assert f"{limit} consecutive attempts made no progress" in why and "exit 6" in why


def test_progress_resets_the_streak():
    hist = [Attempt(0.0, 0, 100), Attempt(1.0, 80, 90), Attempt(2.0, 80, 99),
            Attempt(3.0, 80, 101), Attempt(4.0, 100, 100)]
    assert no_progress_streak(hist) == 1
    d, _ = next_retry(hist, now=4.0, policy=RetryPolicy(no_progress_limit=2, max_retries=10))
    assert isinstance(d, Retry)
    assert no_progress_streak([Attempt(0.0, 5, 5)]) == 1  # an original run that committed nothing


def test_budget_gives_up_after_max_retries():
    p = RetryPolicy(jitter=0.0, max_retries=3)
    assert isinstance(next_retry(_chain(1, 2, 3), now=2000.0, policy=p)[0], Retry)
    d, why = next_retry(_chain(1, 2, 3, 4), now=3000.0, policy=p)
    assert d == GiveUp("budget") and d.exit_code == EXIT_NO_PROGRESS
    assert "max_retries=3" in why
    assert next_retry(_chain(1), now=0.0, policy=RetryPolicy(max_retries=0))[0] == GiveUp("budget")


def test_bad_histories_and_times_raise():
    with pytest.raises(RetryPolicyError, match="empty"):
        next_retry([], now=0.0)
    with pytest.raises(RetryPolicyError, match="now=5.0"):
        next_retry(_chain(1, t0=10.0), now=5.0)
    with pytest.raises(RetryPolicyError, match="history must be in time order"):
        next_retry([Attempt(10.0, 0, 1), Attempt(5.0, 0, 2)], now=20.0)
    with pytest.raises(RetryPolicyError, match="reached_step=3 is below start_step=5"):
        Attempt(0.0, 5, 3)
    with pytest.raises(RetryPolicyError, match="start_step=-1"):
        Attempt(0.0, -1, 3)
    with pytest.raises(RetryPolicyError, match="failed_at=inf"):
        Attempt(float("inf"), 0, 3)
    with pytest.raises(RetryPolicyError, match="history\\[0\\]"):
        next_retry([(0.0, 0, 1)], now=1.0)
    with pytest.raises(RetryPolicyError, match="seed 'x'"):
        backoff_delay(0, seed="x")
    with pytest.raises(RetryPolicyError, match="-1"):
        backoff_delay(-1)
