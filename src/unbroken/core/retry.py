"""Retry backoff: how long to wait before the next automatic attempt.

Why automatic retry at all: in the Backend.AI operations report (backendai.md §1 F4, §7) the
scheduler re-submitted failed sessions by itself — 12 chains, 73 attempts, **33.3 % of chains
succeeded against 12.5 % for manual recovery (2.7×)** — with a median gap of **11 min (IQR
10–11)** between attempts, read as a 10-min delay plus about a minute of scheduling. A chain is
the run of consecutive automatic attempts until success or give-up; it averaged about six
attempts (73 / 12).

Who uses it: the recovery ladder's ``REQUEUE`` rung (``core.ladder``) waits
``backoff_delay(a)`` before its ``a``-th resubmission in an incident. *When to stop* retrying is
the ladder's budget (its attempts per rung and its time budget, past which it gives up with
exit 6), not a second budget here: one job, one give-up rule.

The delay before retry ``a`` (0-based) is ``min(max_delay, base · factor**a)`` scaled down by a
seeded jitter in ``(1 − jitter, 1]``: the report's 10 minutes (``base = 600 s``) doubling as in
its "exponential 10·2^a min capped" variant (backendai.md §7, marked [U/I] there); the cap
(1 h) and the jitter (10 %, about the report's 10–11 min spread) are our choices. Jitter only
ever *shortens* a delay, so ``max_delay`` is a hard bound, and it de-synchronises many jobs
retrying after one shared fault (each with its own seed). ``factor = 1`` gives the report's
fixed 10-min chains.

Pure: no clock, no I/O; the jitter comes from the passed ``seed`` only, so the same seed gives
the same schedule.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["RetryPolicyError", "RetryPolicy", "backoff_delay"]


class RetryPolicyError(ValueError):
    """A retry policy or index that cannot be used; the message names the bad value."""


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 600.0              # s, first delay: the report's 10 min (backendai.md §7)
    factor: float = 2.0              # growth per retry: "10·2^a min" (§7, [U/I])
    max_delay: float = 3600.0        # s, cap on one delay (our choice)
    jitter: float = 0.1              # fraction a delay may be shortened by (our choice)

    def __post_init__(self) -> None:
        for name in ("base", "factor", "max_delay", "jitter"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise RetryPolicyError(f"retry policy {name}={v!r} is not a finite number")
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
