"""Fail-slow over rounds: a group slower than its peers, round after round.

Commit times cannot show a straggler (a synchronous step waits for the slowest), so every
group journals its own compute time per step and the guard buckets those samples into rounds
(``core.anomaly.bucket_rounds``); a group slower than 1.5x its peers' median in 5 consecutive
closed rounds is flagged (``core.anomaly.failslow``: ByteRobust's 5 rounds of 10 s scaled to
the demo). The verdict changes only when a round closes, so it is judged then and not on every
tick of the supervisor's loop (re-bucketing every sample 20 times a second was its CPU), and
only the samples of the rounds a verdict reads are kept (the whole run made every round
O(steps)).
"""

from __future__ import annotations

from unbroken.core.anomaly import FailSlowPolicy, bucket_rounds, failslow

__all__ = ["FailSlowRounds"]


class FailSlowRounds:
    """The samples of the open window and the groups flagged so far (each once)."""

    def __init__(self, policy: FailSlowPolicy | None = None) -> None:
        self.policy = policy or FailSlowPolicy.demo()
        self.samples: list[tuple[float, int, float]] = []  # (t, group uid, compute_s)
        self.start: float | None = None
        self.closed = 0  # closed rounds already judged
        self.flagged: set[int] = set()

    def add(self, t: float, uid: int, compute_s: float) -> None:
        if self.start is None:
            self.start = t
        self.samples.append((t, uid, compute_s))

    def closing(self, now: float) -> int | None:
        """The number of closed rounds when one closed since the last verdict and enough
        are in for one; else None (nothing new to judge)."""
        p = self.policy
        if self.start is None or now - self.start < p.round_s * p.rounds:
            return None
        n = int((now - self.start) // p.round_s)
        return n if n > self.closed else None

    def judge(self, n_closed: int) -> tuple[list[int], str]:
        """The verdict over the first ``n_closed`` rounds (the current one is still filling):
        the groups flagged for the first time, and the reason."""
        assert self.start is not None
        p = self.policy
        self.closed = n_closed
        # a verdict needs the last K rounds (twice that, so a streak's length still reads right)
        keep = self.start + max(0, n_closed - 2 * p.rounds) * p.round_s
        if self.samples and self.samples[0][0] < keep:
            self.samples = [x for x in self.samples if x[0] >= keep]
        rounds = bucket_rounds(self.samples, self.start, p)
        flagged, reason = failslow(rounds[:n_closed], p)
        new = sorted(set(flagged) - self.flagged)
        self.flagged.update(new)
        return new, reason
