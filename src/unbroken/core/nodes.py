"""Node-level decisions for the node agents (``unbroken.nodes``): pure, no I/O, no clock.

* which groups each node hosts (``core.placement.node_placement``: a node loss costs each
  shard type at most one host when it can), and the warning when it cannot;
* which nodes are lost by their silence: an agent's heartbeat judged with the same rule as a
  member's (``core.membership``): silent for ``staleness`` s while the other agents beat as
  many periods as fit in it, or three times as long whatever they do (a starved coordinator
  judges nobody by the wall clock alone);
* whether a restart has any node to run on (none live: the job ends, the checkpoint waits
  for new nodes);
* which fenced nodes come back (their agent asked, and beats again) as spare capacity;
* where a new warm spare goes: the least loaded live node with room left;
* whether the agents' declared room (``--slots``, ``--spares``) holds the placement;
* which network interface a node's workers bind gloo to: the one whose address routes to
  the coordinator (it reaches every peer that reaches the coordinator);
* when an agent is cut off from the coordinator: a heartbeat call that has not returned for
  ``cut_after`` s of the watchdog's own ticks (a cut link blocks a call in the kernel for
  minutes, no error comes; the coordinator fenced the node long before);
* what a node's own health sample says is wrong with the machine (memory or disk nearly
  gone, the CPUs oversubscribed): problems the guard reports (log-only: a full disk or a
  busy neighbour is for an operator, not a reason to kill a job);
* which node stands out from its peers (``peer_health``): fixed floors miss a machine that
  is merely worse than the others running the same job (a neighbour's batch job at load
  1.5 per CPU where the peers sit at 0.5, memory filling on one node only), which is what
  makes stragglers and OOM kills first; Backend.AI's report judges such signals against the
  peers, robust z-score and band (``core.anomaly.peer_outliers``), over several samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping

from unbroken.core.anomaly import PeerPolicy, median, peer_outliers
from unbroken.core.membership import Observation, silence_rule, silent_members
from unbroken.core.placement import check_nodes, make_layout, node_placement, nodes_needed

__all__ = ["place_groups", "on_live_nodes", "no_node_left", "stale_nodes", "rejoining",
           "spare_node", "check_room", "gloo_interface", "HealthPolicy", "health_problems",
           "CUT_OFF_S", "BeatWatch", "watch_beat", "health_signals", "peer_health",
           "PEER_ROUNDS"]


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


#: a heartbeat blocked this long means the node is cut off (the coordinator fences a node after
#: ``node_staleness`` = 1 s of silence by default: 3 s leaves it long done)
CUT_OFF_S = 3.0


@dataclass(frozen=True)
class BeatWatch:
    """What the watchdog remembers between its ticks: the beats begun at the last tick and
    for how many consecutive ticks one beat has been in flight."""

    seen: int = -1
    ticks: int = 0


def watch_beat(state: BeatWatch, calls: int, busy: bool, period: float,
               cut_after: float = CUT_OFF_S) -> tuple[BeatWatch, str | None]:
    """One watchdog tick: the new state and, once the same beat has been in flight for
    ``cut_after`` s, the reason the node is cut off (else None).

    Counted in ticks, not wall time: a SIGSTOPped agent (a drill, a debugger) stops both its
    threads, and a beat caught in flight must not read as blocked for the whole stop once it
    is continued. ValueError unless ``period`` and ``cut_after`` are > 0."""
    if not (period > 0 and cut_after > 0):
        raise ValueError(f"watchdog period {period!r} and cut_after {cut_after!r} must be > 0")
    ticks = state.ticks + 1 if busy and calls == state.seen else 0
    blocked = ticks * period
    if blocked >= cut_after:
        return BeatWatch(calls, ticks), f"a heartbeat to the coordinator blocked for {blocked:.1f}s"
    return BeatWatch(calls, ticks), None


def no_node_left(live: Iterable[int]) -> str | None:
    """Why a restart has nowhere to run (no node is live), or None when it has. The caller
    ends the job there (exit 6): respawning onto nothing would only spin, and the last
    checkpoint is what new nodes continue from."""
    if any(True for _ in live):
        return None
    return ("every node was lost: no node is left to restart the job on; --resume continues "
            "from the last checkpoint on new nodes")


def on_live_nodes(groups: int, redundancy: int, live: list[int]) -> tuple[list[int], str | None]:
    """``place_groups`` on the nodes still live (a restart after node losses): group -> the
    node index it runs on, and the warning. ValueError (:func:`no_node_left`'s reason) when
    no node is live."""
    why = no_node_left(live)
    if why is not None:
        raise ValueError(why)
    node_of, warning = place_groups(groups, redundancy, min(len(live), groups))
    return [sorted(live)[k] for k in node_of], warning


def rejoining(asked: Iterable[int], fenced_at: Mapping[int, int],
              counters: Mapping[int, int]) -> tuple[list[int], str]:
    """Fenced nodes to take back, and why: those whose agent asked (``asked``: it woke up and
    killed what it ran) and whose heartbeat counter moved past its value when the node was
    fenced (``fenced_at``): a live agent, not a stale request. They come back as spare
    capacity only: their groups were re-placed or masked, and a group is never moved back."""
    back = sorted(k for k in set(asked) if k in fenced_at
                  and counters.get(k, 0) > fenced_at[k])
    return back, (f"nodes {back}: their agents asked to rejoin and beat again; they take "
                  f"spares" if back else "no fenced node asked and beats again")


def spare_node(load: Mapping[int, int], live: Iterable[int],
               room: Mapping[int, int] | None = None) -> int | None:
    """The live node with the fewest processes (``load``: node -> processes it runs), the
    lowest index on a tie, among those with room left (``room``: node -> the processes it
    may run, groups and spares; absent: no limit); None when there is none."""
    nodes = [k for k in sorted(live) if room is None or k not in room
             or load.get(k, 0) < room[k]]
    return min(nodes, key=lambda k: (load.get(k, 0), k)) if nodes else None


def check_room(node_of: list[int], spares: int, slots: Mapping[int, int | None],
               spare_slots: Mapping[int, int | None]) -> str | None:
    """One line naming the first node whose declared room (``slots``: groups, ``spare_slots``:
    warm spares; None: no limit) the placement overfills, or the spares that fit nowhere;
    None when it all fits. The warm spares start on the least loaded nodes, so only their
    total is checked against the room left."""
    for k in sorted(slots):
        placed = node_of.count(k)
        if slots[k] is not None and placed > slots[k]:
            return (f"node {k}: --slots {slots[k]} but the placement puts {placed} groups "
                    f"there ({len(node_of)} groups on {len(slots)} nodes)")
    if any(v is None for v in spare_slots.values()):
        return None
    free = sum(spare_slots.values())
    if spares > free:
        return (f"{spares} warm spares but the nodes' --spares add up to {free}; give the "
                f"agents more --spares or the job fewer --spares")
    return None


def gloo_interface(addresses: Mapping[str, str], local: str) -> tuple[str | None, str]:
    """The interface whose address is ``local`` (the address this node reaches the
    coordinator from), and why; None when no interface has it (the caller leaves gloo's
    default). ``addresses``: interface name -> its IPv4 address."""
    for name in sorted(addresses):
        if addresses[name] == local:
            return name, f"{name} holds {local}, the address that reaches the coordinator"
    return None, f"no interface holds {local}: gloo picks by the host name"


@dataclass(frozen=True)
class HealthPolicy:
    """Where a node's machine sample becomes a problem (our choices: a checkpoint of a large
    model needs gigabytes free; under 5 % of memory free the OOM killer is near; a run-queue
    over twice the CPUs starves the training processes of this node)."""

    min_mem_frac: float = 0.05
    min_disk_mb: float = 1024.0
    max_load_per_cpu: float = 2.0


def health_problems(sample: Mapping[str, float], policy: HealthPolicy = HealthPolicy()
                    ) -> list[tuple[str, str]]:
    """``(signal, reason)`` for each problem of one node sample (``nodes.health.sample_node``:
    ``mem_avail_mb``, ``mem_total_mb``, ``disk_free_mb``, ``load1``, ``cpus``); a signal the
    sample lacks is not judged."""
    out: list[tuple[str, str]] = []
    avail, total = sample.get("mem_avail_mb"), sample.get("mem_total_mb")
    if avail is not None and total and avail / total < policy.min_mem_frac:
        out.append(("memory", f"{avail:.0f} MiB of {total:.0f} MiB memory available "
                              f"(< {policy.min_mem_frac:.0%})"))
    disk = sample.get("disk_free_mb")
    if disk is not None and disk < policy.min_disk_mb:
        out.append(("disk", f"{disk:.0f} MiB free on the run directory's filesystem "
                            f"(< {policy.min_disk_mb:.0f} MiB: checkpoints will fail)"))
    load, cpus = sample.get("load1"), sample.get("cpus")
    if load is not None and cpus and load / cpus > policy.max_load_per_cpu:
        out.append(("load", f"load {load:.1f} on {cpus:.0f} CPUs (> {policy.max_load_per_cpu:g} "
                            f"per CPU: the training processes wait for a core)"))
    return out


#: how far above the peers' median a signal must also be to matter (our choice: z alone flags
#: 0.3 against an idle 0.05): half a runnable process per CPU more, a tenth more of memory
PEER_MIN_GAP = {"load_per_cpu": 0.5, "mem_used_frac": 0.10}

#: consecutive samples of a node (one a second) that must stand out before it is reported:
#: one sample is a cron job, three a neighbour that stays
PEER_ROUNDS = 3


def health_signals(sample: Mapping[str, float]) -> dict[str, float]:
    """The signals of a node sample that compare across peers: ``load_per_cpu`` and
    ``mem_used_frac`` (shares, so machines of other sizes compare; free disk depends on the
    filesystem's size and is judged by its floor alone). A value that is not a finite
    number leaves its signal out, as a probe that failed does."""
    def num(k: str) -> float | None:
        v = sample.get(k)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return float(v) if ok else None

    out: dict[str, float] = {}
    load, cpus = num("load1"), num("cpus")
    if load is not None and cpus:
        out["load_per_cpu"] = load / cpus
    avail, total = num("mem_avail_mb"), num("mem_total_mb")
    if avail is not None and total:
        out["mem_used_frac"] = 1.0 - avail / total
    return out


def peer_health(latest: Mapping[Hashable, Mapping[str, float]],
                policy: PeerPolicy = PeerPolicy(), min_gap: Mapping[str, float] = PEER_MIN_GAP
                ) -> tuple[dict[Hashable, dict[str, float]], str]:
    """Nodes whose sample stands *above* their peers' (``{node: {signal: z}}``: z > 0 and at
    least ``min_gap`` over the peers' median; a quieter machine is no problem) and the
    reason; ``latest``: each live node's newest sample. Needs ``policy.min_peers`` other
    nodes reporting a signal to judge it."""
    signals = {n: health_signals(s) for n, s in latest.items()}
    flags, _ = peer_outliers(signals, policy)

    def gap(n: Hashable, k: str) -> float:
        peers = [sig[k] for m, sig in signals.items() if m != n and k in sig]
        return signals[n][k] - median(peers)

    above = {n: {k: z for k, z in zs.items() if z > 0 and gap(n, k) >= min_gap.get(k, 0.0)}
             for n, zs in flags.items()}
    above = {n: zs for n, zs in above.items() if zs}
    if not above:
        return {}, f"peers: no node above its {len(signals) - 1} peers"
    detail = "; ".join(f"node {n}: " + ", ".join(
        f"{k} {signals[n][k]:.2f} (z={z:+.1f})" for k, z in zs.items())
        for n, zs in sorted(above.items(), key=lambda kv: repr(kv[0])))
    return above, (f"peers: {detail} against the other {len(signals) - 1} nodes "
                   f"(|z| > {policy.z:g}, outside their P{policy.band:g}-P{100 - policy.band:g})")
