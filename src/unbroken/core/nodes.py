"""Node-level decisions for the node agents (``unbroken.nodes``): pure, no I/O, no clock.

* which groups each node hosts (``core.placement.node_placement``: a node loss costs each
  shard type at most one host when it can), and the warning when it cannot;
* which nodes are lost by their silence: an agent's heartbeat judged with the same rule as a
  member's (``core.membership``): silent for ``staleness`` s while the other agents beat as
  many periods as fit in it, or three times as long whatever they do (a starved coordinator
  judges nobody by the wall clock alone);
* where a new warm spare goes: the least loaded live node.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Mapping

from unbroken.core.membership import Observation, silence_rule, silent_members
from unbroken.core.placement import check_nodes, make_layout, node_placement, nodes_needed

__all__ = ["place_groups", "stale_nodes", "spare_node"]


def place_groups(groups: int, redundancy: int, nodes: int) -> tuple[list[int], str | None]:
    """``node_of`` (group -> node) for ``groups`` groups on ``nodes`` nodes, and a warning
    (one line, the nodes a safe placement would take) when a node loss is not safe.
    Raises ValueError (one line) unless 1 <= nodes <= groups."""
    check_nodes(groups, nodes)
    layout = make_layout(groups, redundancy)
    p = node_placement(layout, nodes)
    if p.safe:
        return list(p.node_of), None
    _need, why = nodes_needed(layout)
    return list(p.node_of), f"{nodes} nodes: {p.reason}; it takes {why}"


def stale_nodes(observations: Mapping[Hashable, Observation], now: float, staleness: float,
                beats: float, heartbeat: float) -> list:
    """Nodes whose agent heartbeat counter has been silent too long (``silent_members`` with
    ``silence_rule(staleness, heartbeat)``). Sorted."""
    min_beats, ceiling = silence_rule(staleness, heartbeat)
    return silent_members(observations, now, staleness, beats, min_beats, ceiling)


def spare_node(load: Mapping[int, int], live: Iterable[int]) -> int | None:
    """The live node with the fewest processes (``load``: node -> processes it runs), the
    lowest index on a tie; None when no node is live."""
    nodes = sorted(live)
    return min(nodes, key=lambda k: (load.get(k, 0), k)) if nodes else None
