"""Auto-retry chains: when to try again, and when to stop trying.

Why automatic retry at all: in the Backend.AI operations report (backendai.md §1 F4, §7) the
scheduler re-submitted failed sessions by itself — 12 chains, 73 attempts, **33.3 % of chains
succeeded against 12.5 % for manual recovery (2.7×)** — with a median gap of **11 min (IQR
10–11)** between attempts, read as a 10-min delay plus about a minute of scheduling. A chain is
the run of consecutive automatic attempts until success or give-up; it averaged about six
attempts (73 / 12).

Why a guard: a fault that retrying cannot fix (a sticky bad node, a bug that fires at the same
step) turns a retry chain into a loop that burns the cluster and hides the failure. So the chain
gives up — and the process exits with ``EXIT_NO_PROGRESS`` (6) so that a launcher or an operator
can tell "stopped retrying on purpose" from a crash (3), an unmaskable wipe-out without
replacements (4) and a lost coordinator (5) — when either

* the last ``no_progress_limit`` attempts (default 3) each failed without committing a step
  beyond the best step committed before it (redoing rolled-back steps is not progress), or
* the retry budget is spent: ``max_retries`` retries after the original failure (default 5,
  so at most six attempts per chain, the report's average).

Both causes mean "automatic recovery is not working; a human must look", hence one exit code;
the reason string says which.

The delay before retry ``a`` (0-based) is ``min(max_delay, base · factor**a)`` scaled down by a
seeded jitter in ``(1 − jitter, 1]``: the report's 10 minutes (``base = 600 s``) doubling as in
its "exponential 10·2^a min capped" variant (backendai.md §7, marked [U/I] there); the cap
(1 h) and the jitter (10 %, about the report's 10–11 min spread) are our choices. Jitter only
ever *shortens* a delay, so ``max_delay`` is a hard bound, and it de-synchronises many jobs
retrying after one shared fault. ``factor = 1`` gives the report's fixed 10-min chains. The same
policy serves requeue with exponential backoff.

Pure: no clock (``now`` is passed in), no I/O; the jitter comes from the passed ``seed`` only,
so the same seed gives the same schedule.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "EXIT_NO_PROGRESS",
    "RetryPolicyError",
    "RetryPolicy",
    "Attempt",
    "Retry",
    "GiveUp",
    "backoff_delay",
    "backoff_schedule",
    "no_progress_streak",
    "next_retry",
]

#: Exit code of a process whose retry chain gave up (no progress, or the retry budget spent).
#: 0 success, 1 demo failed, 2 bad input, 3 error, 4 wipe-out without replacements,
#: 5 coordinator lost are taken.
EXIT_NO_PROGRESS = 6


class RetryPolicyError(ValueError):
    """A retry policy, history or time that cannot be used; the message names the bad value."""


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 600.0              # s, first delay: the report's 10 min (backendai.md §7)
    factor: float = 2.0              # growth per retry: "10·2^a min" (§7, [U/I])
    max_delay: float = 3600.0        # s, cap on one delay (our choice)
    jitter: float = 0.1              # fraction a delay may be shortened by (our choice)
    max_retries: int = 5             # retries after the original failure (~6 attempts/chain, §7)
    no_progress_limit: int = 3       # consecutive attempts without progress before giving up

    def __post_init__(self) -> None:
        for name in ("base", "factor", "max_delay", "jitter"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise RetryPolicyError(f"retry policy {name}={v!r} is not a finite number")
        for name in ("max_retries", "no_progress_limit"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise RetryPolicyError(f"retry policy {name}={v!r} is not an integer")
        if self.base <= 0:
            raise RetryPolicyError(f"retry policy base={self.base} must be > 0 seconds")
        if self.factor < 1:
            raise RetryPolicyError(f"retry policy factor={self.factor} must be >= 1 "
                                   f"(a shrinking backoff is not a backoff)")
        if self.max_delay < self.base:
            raise RetryPolicyError(f"retry policy max_delay={self.max_delay} is below "
                                   f"base={self.base}")
        if not 0 <= self.jitter < 1:
            raise RetryPolicyError(f"retry policy jitter={self.jitter} must be in [0, 1)")
        if self.max_retries < 0:
            raise RetryPolicyError(f"retry policy max_retries={self.max_retries} is negative")
        if self.no_progress_limit < 1:
            raise RetryPolicyError(f"retry policy no_progress_limit={self.no_progress_limit} "
                                   f"must be >= 1")


@dataclass(frozen=True)
class Attempt:
    """One failed attempt of a chain (the first is the original run)."""
    failed_at: float    # caller's clock when the attempt failed
    start_step: int     # the step it resumed from (a checkpoint or snapshot)
    reached_step: int   # the highest step it committed before failing

    def __post_init__(self) -> None:
        t = self.failed_at
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise RetryPolicyError(f"attempt failed_at={t!r} is not a finite time")
        for name in ("start_step", "reached_step"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise RetryPolicyError(f"attempt {name}={v!r} must be an integer >= 0")
        if self.reached_step < self.start_step:
            raise RetryPolicyError(f"attempt reached_step={self.reached_step} is below "
                                   f"start_step={self.start_step}")


@dataclass(frozen=True)
class Retry:
    at: float        # when to start the next attempt (caller's clock)
    delay: float     # the backoff delay that gave ``at`` (from the last failure)
    retry: int       # 1-based number of this retry in the chain


@dataclass(frozen=True)
class GiveUp:
    cause: str                      # "no_progress" or "budget"
    exit_code: int = EXIT_NO_PROGRESS


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RetryPolicyError(f"seed {seed!r} is not an integer")
    return seed


def backoff_delay(retry_index: int, policy: RetryPolicy = RetryPolicy(), seed: int = 0) -> float:
    """Seconds to wait before retry ``retry_index`` (0-based) after a failure.

    ``min(max_delay, base * factor**retry_index) * (1 - jitter * u)`` with ``u`` in [0, 1)
    drawn from ``(seed, retry_index)`` alone, so a schedule can be recomputed at any point.
    """
    if isinstance(retry_index, bool) or not isinstance(retry_index, int) or retry_index < 0:
        raise RetryPolicyError(f"retry index {retry_index!r} must be a non-negative integer")
    seed = _check_seed(seed)
    # base * factor**a overflows to inf long after it passed the cap: compare in logs.
    if policy.factor == 1 or retry_index * math.log(policy.factor) < math.log(
            policy.max_delay / policy.base):
        raw = min(policy.max_delay, policy.base * policy.factor ** retry_index)
    else:
        raw = policy.max_delay
    u = random.Random(f"unbroken.retry/{seed}/{retry_index}").random()
    return raw * (1.0 - policy.jitter * u)


def backoff_schedule(n: int, policy: RetryPolicy = RetryPolicy(), seed: int = 0) -> list[float]:
    """The first ``n`` backoff delays, ``[backoff_delay(a, policy, seed) for a in range(n)]``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise RetryPolicyError(f"schedule length {n!r} must be a non-negative integer")
    return [backoff_delay(a, policy, seed) for a in range(n)]


def _check_history(history: Sequence[Attempt]) -> None:
    if not history:
        raise RetryPolicyError("retry history is empty: there is no failure to retry")
    prev_t = -math.inf
    for i, a in enumerate(history):
        if not isinstance(a, Attempt):
            raise RetryPolicyError(f"history[{i}] = {a!r} is not an Attempt")
        if a.failed_at < prev_t:
            raise RetryPolicyError(f"history[{i}].failed_at={a.failed_at} is before the previous "
                                   f"failure at {prev_t} (history must be in time order)")
        prev_t = a.failed_at


def no_progress_streak(history: Sequence[Attempt]) -> int:
    """How many of the last attempts, consecutively, committed no step beyond the best before.

    An attempt made progress when ``reached_step`` exceeds both its own ``start_step`` and the
    highest step any earlier attempt reached: steps redone after a rollback do not count.
    """
    _check_history(history)
    best = -1
    streak = 0
    for a in history:
        floor = max(best, a.start_step)
        if a.reached_step > floor:
            streak = 0
        else:
            streak += 1
        best = max(best, a.reached_step)
    return streak


def next_retry(history: Sequence[Attempt], now: float, policy: RetryPolicy = RetryPolicy(),
               seed: int = 0) -> tuple[Retry | GiveUp, str]:
    """Retry (at which time) or give up, after the last failure in ``history``.

    ``history`` is the chain so far, oldest first, the last entry being the failure just
    seen. The no-progress guard is checked first (it is the more specific cause), then the
    budget. A retry is due ``backoff_delay(retries_so_far)`` after the last failure, or at
    ``now`` if the decision comes later than that.
    """
    _check_history(history)
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise RetryPolicyError(f"now={now!r} is not a finite time")
    last = history[-1]
    if now < last.failed_at:
        raise RetryPolicyError(f"now={now} is before the last failure at {last.failed_at}")
    streak = no_progress_streak(history)
    if streak >= policy.no_progress_limit:
        return GiveUp("no_progress"), (
            f"give up (exit {EXIT_NO_PROGRESS}): {streak} consecutive attempts made no progress "
            f"past step {max(a.reached_step for a in history)} "
            f"(no_progress_limit={policy.no_progress_limit})")
    retries = len(history) - 1
    if retries >= policy.max_retries:
        return GiveUp("budget"), (
            f"give up (exit {EXIT_NO_PROGRESS}): retry budget spent ({retries} of "
            f"max_retries={policy.max_retries} retries used)")
    delay = backoff_delay(retries, policy, seed)
    at = max(float(now), last.failed_at + delay)
    return Retry(at=at, delay=delay, retry=retries + 1), (
        f"retry {retries + 1}/{policy.max_retries} at t={at:.1f} (delay {delay:.1f} s after the "
        f"failure at t={last.failed_at:.1f}; no-progress streak {streak}/"
        f"{policy.no_progress_limit})")
