"""Node health: each node agent's machine sample (memory, disk, load: ``nodes.health``).

Two judgements, both log-only (a full disk or a busy neighbour is for an operator, not a
reason to kill a job): the sample against fixed floors (``core.nodes.health_problems``), a
problem reported once while it lasts; and against the other live nodes' newest samples
(``core.nodes.peer_health``: load per CPU, share of memory in use), a node above its peers in
``PEER_ROUNDS`` samples in a row reported once, until it falls back. Fixed floors miss a
machine that is merely worse than the others running the same job, which is what makes
stragglers and OOM kills first.
"""

from __future__ import annotations

from unbroken.core.nodes import PEER_ROUNDS, health_problems, peer_health
from unbroken.events import Event

__all__ = ["NodeWatch", "SAMPLE_STALE_S"]

#: a node sample older than this (five of its agent's 1 s samples) is not a peer any more
SAMPLE_STALE_S = 5.0


class NodeWatch:
    def __init__(self) -> None:
        self.told: set[tuple[int, str]] = set()  # (node, signal) problems alerted
        self.latest: dict[int, dict] = {}        # node -> newest machine sample
        self.hits: dict[int, int] = {}           # node -> consecutive samples above its peers

    def observe(self, ev: dict) -> list[dict]:
        """The alerts one sample raises (journal events)."""
        node = ev["node"]
        out = []
        now = {sig: why for sig, why in health_problems(ev)}
        for sig, why in now.items():
            if (node, sig) not in self.told:
                self.told.add((node, sig))
                out.append({"event": Event.ALERT, "how": "node_health", "node": node,
                            "signal": sig, "group": None, "reason": why, "t": ev["t"]})
        self.told -= {(n, s) for n, s in self.told if n == node and s not in now}
        peers = self._peers(node, ev)
        return out + ([peers] if peers else [])

    def _peers(self, node: int, ev: dict) -> dict | None:
        self.latest[node] = ev
        live = {n: s for n, s in self.latest.items()
                if ev["t"] - s["t"] <= SAMPLE_STALE_S}  # a lost node leaves the peers
        above, why = peer_health(live)
        if node not in above:
            self.hits[node] = 0
            return None
        self.hits[node] = self.hits.get(node, 0) + 1
        if self.hits[node] != PEER_ROUNDS:
            return None
        return {"event": Event.ALERT, "how": "node_peers", "node": node,
                "signal": ",".join(sorted(above[node])), "group": None,
                "reason": f"{why}, {PEER_ROUNDS} samples in a row", "t": ev["t"]}
