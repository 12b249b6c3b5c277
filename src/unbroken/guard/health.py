"""Group health against the peers: each group's agent (:mod:`unbroken.detect.health`)
journals its CPU use, memory and threads once a second; each second the newest fresh samples
of the live groups are compared (``core.anomaly.peer_outliers``, backendai.md §2), and a group
that stands out in 3 consecutive rounds is reported once (an alert, never an action: one noisy
scrape is not a fault). Thread counts are reported, not compared: rank 0's checkpoint writer
is one more, by design.
"""

from __future__ import annotations

from unbroken.core.anomaly import GROUP_MIN_GAP, PeerPolicy, peer_outliers, persisting

__all__ = ["GroupHealth"]


class GroupHealth:
    SIGNALS = ("cpu_util", "rss_mb")
    MIN_GAP = GROUP_MIN_GAP  # core's: groups that all wait read ~0 of a core, not an outlier
    ROUNDS = 3
    PERIOD_S = 1.0
    FRESH_S = 2.5  # a sample older than this is from a group that stopped reporting

    def __init__(self) -> None:
        self.latest: dict[int, dict] = {}  # uid -> newest sample
        self.hits: dict[int, int] = {}     # uid -> consecutive outlier rounds
        self.round = 0.0
        self.told: set[int] = set()

    def add(self, uid: int, ev: dict) -> None:
        self.latest[uid] = ev

    def judge(self, now: float, live: set[int] | None) -> list[tuple[int, dict, str]]:
        """Once a ``PERIOD_S``: the groups that stood out for ``ROUNDS`` rounds in a row and
        were not reported before, as (uid, {signal: z}, reason)."""
        if now - self.round < self.PERIOD_S:
            return []
        self.round = now
        fresh = {u: {k: float(e[k]) for k in self.SIGNALS if k in e}
                 for u, e in self.latest.items()
                 if now - float(e.get("t", 0)) < self.FRESH_S and (live is None or u in live)}
        flags, reason = peer_outliers({u: sig for u, sig in fresh.items() if sig},
                                      PeerPolicy(), self.MIN_GAP)
        self.hits, due = persisting(self.hits, flags, self.ROUNDS)
        out = []
        for u in due:
            if u not in self.told:
                self.told.add(u)
                out.append((u, {k: round(z, 2) for k, z in flags[u].items()},
                            f"{reason} ({self.ROUNDS} rounds in a row)"))
        return out
