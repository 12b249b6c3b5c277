"""Who is alive: the pure decisions behind the fault-tolerant communicator.

`unbroken.runtime.ftcomm` keeps one heartbeat counter per worker in a store. Each observer
remembers, per peer, the last counter value it saw and *its own* clock reading when that value
last changed. Judging liveness from "when did I last see it move" (rather than from a timestamp
the peer wrote) makes the decision immune to clock skew between machines.

Everything here is pure: no torch, no I/O, no clock. Time is passed in, so every rule can be
unit-tested without processes.

Rules
-----
* A peer whose counter has never moved past 0 has not started yet; it is *not* stale (start-up
  is bounded by the process-group init timeout instead, which needs every initial member).
* A peer is stale when ``now - last_change > staleness`` (strictly greater) *and* the other
  members made at least ``staleness / heartbeat_period`` beats meanwhile (the beat clock,
  ``beat_clock``): silence is judged by what the peer could have done, not by wall time alone.
  On a starved machine nobody beats, the clock stands still and nobody is judged; a stopped
  peer is the one that stays silent while its peers keep beating. When the clock stands still
  (most members silent at once), wall time alone judges after ``ceiling`` seconds.
* A peer that a coordinator declared dead (for example a launcher that saw the process exit) is
  not live, whatever its heartbeat says: a SIGKILLed process keeps a fresh-looking heartbeat for
  up to ``staleness`` seconds, and a death notice removes that wait.
* The members of a new generation are the joiners, in a deterministic order (sorted), so rank
  ``i`` of the new process group is ``members[i]`` on every survivor.
* An observer whose own reads were more than ``staleness / 2`` apart was starved itself (its
  thread got no CPU): the silence it could not watch says nothing about the peers, so every
  observation restarts at ``now`` (``starved_observer``) and nobody is judged on it.
* After a gloo connection error (a peer process is gone), the rendezvous waits for a silent
  member only a few heartbeat periods, not the full staleness (``rendezvous_staleness``); it
  is complete once every live member joined and every expected joiner registered or was
  declared dead (``rendezvous_ready``). A leader that dies before it publishes is taken over
  by the first member to claim the next lead epoch (``leader_gone``).
* The first collective of a generation carries every member's ``Report``; ``settle`` turns
  them into the one path all take (roll forward, state copy to joiners, which plan).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "Observation",
    "observe",
    "stale_members",
    "beat_clock",
    "silent_members",
    "silence_rule",
    "starved_observer",
    "live_members",
    "rendezvous_ready",
    "rendezvous_staleness",
    "LEADER_SILENCE",
    "leader_gone",
    "leader_look_s",
    "next_members",
    "generation_reports",
    "Report",
    "Settle",
    "settle",
]

#: (last counter value seen, observer's clock when that value was first seen, the beat clock
#: (``beat_clock``) at that moment)
Observation = tuple[int, float, float]


def observe(
    prev: Mapping[Hashable, Observation],
    counters: Mapping[Hashable, int],
    now: float,
    beats: float = 0.0,
) -> dict[Hashable, Observation]:
    """Fold freshly read heartbeat counters into the observation table.

    A counter that changed (or a peer seen for the first time) gets ``now`` and the beat clock
    ``beats`` as its last change; an unchanged counter keeps its old ones. Peers absent from
    ``counters`` keep their previous observation.
    """
    out = dict(prev)
    for uid, value in counters.items():
        value = int(value)
        old = prev.get(uid)
        if old is None or old[0] != value:
            out[uid] = (value, float(now), float(beats))
    return out


def beat_clock(
    prev: Mapping[Hashable, Observation],
    counters: Mapping[Hashable, int],
    own: int = 1,
) -> float:
    """How many beats a live member made since the last read: the high median of every started
    member's counter increase, the observer's own ``own`` beat included.

    Summed over reads this is the clock ``silent_members`` judges silence by. The median keeps
    one stopped member from holding the clock back (its increase is 0) and one member's burst
    from pushing it on; the *high* median lets the observer and one peer decide between two.
    Members not started yet (counter 0) or seen for the first time do not vote.
    """
    incs = [own] + [int(v) - prev[u][0] for u, v in counters.items()
                    if u in prev and prev[u][0] > 0]
    incs.sort()
    return float(max(incs[len(incs) // 2], 0))


def silent_members(
    observations: Mapping[Hashable, Observation],
    now: float,
    staleness: float,
    beats: float,
    min_beats: float,
    ceiling: float,
) -> list:
    """Started members whose counter has not moved for more than ``staleness`` s while the beat
    clock advanced by at least ``min_beats``, or for more than ``ceiling`` s whatever the
    clock says (most members silent at once: the clock cannot move). Sorted."""
    if staleness <= 0:
        raise ValueError(f"staleness must be > 0, got {staleness}")
    return sorted(u for u, (c, t, b) in observations.items() if c > 0 and (
        (now - t > staleness and beats - b >= min_beats) or now - t > ceiling))


def silence_rule(staleness: float, heartbeat_period: float) -> tuple[int, float]:
    """``(min_beats, ceiling)`` for ``silent_members``: silent for ``staleness`` s while the
    others beat as many periods as fit in it, or silent three times as long whatever the clock
    says (most members silent at once)."""
    return int(staleness / heartbeat_period + 1e-9), 3 * staleness


def starved_observer(
    observations: Mapping[Hashable, Observation],
    last_read: float,
    now: float,
    staleness: float,
    beats: float = 0.0,
) -> tuple[dict[Hashable, Observation], str | None]:
    """The observations to judge by, and why they were restarted (None: they were not).

    ``last_read`` is the observer's clock at its previous read. More than ``staleness / 2``
    before ``now``, the observer itself was starved: half a staleness is the most a peer's
    silence may be "watched" by nobody, or a starved observer would judge live peers on the
    time it slept through. Each observation then keeps its counter and restarts at ``now``
    and the beat clock ``beats``; the next reads judge from there.
    """
    if staleness <= 0:
        raise ValueError(f"staleness must be > 0, got {staleness}")
    gap = now - last_read
    if gap <= staleness / 2:
        return dict(observations), None
    return ({u: (c, float(now), float(beats)) for u, (c, _t, _b) in observations.items()},
            f"observer starved: {gap:.2f}s between reads > staleness/2 ({staleness / 2:g}s)")


def stale_members(
    heartbeats: Mapping[Hashable, float],
    now: float,
    staleness: float,
) -> list:
    """Peers whose last heartbeat change is more than ``staleness`` seconds before ``now``.

    ``heartbeats`` maps uid -> observer-clock time of the last change. Result is sorted.
    """
    if staleness <= 0:
        raise ValueError(f"staleness must be > 0, got {staleness}")
    return sorted(uid for uid, t in heartbeats.items() if now - t > staleness)


def live_members(
    members: Iterable[Hashable],
    observations: Mapping[Hashable, Observation],
    now: float,
    staleness: float,
    dead: Iterable[Hashable] = (),
    beats: float | None = None,
    min_beats: float = 0.0,
    ceiling: float = float("inf"),
) -> list:
    """Members that are live: not declared dead, and not stale (never-started counts as live).

    With ``beats`` (the observer's beat clock) silence is judged by ``silent_members``;
    without it by wall time alone (``stale_members``). Keeps the order of ``members``.
    """
    dead = set(dead)
    if beats is not None:
        stale = set(silent_members(observations, now, staleness, beats, min_beats, ceiling))
    else:
        started = {u: o[1] for u, o in observations.items() if o[0] > 0}
        stale = set(stale_members(started, now, staleness))
    return [u for u in members if u not in dead and u not in stale]


def rendezvous_ready(joined: Iterable[Hashable], live: Iterable[Hashable],
                     expected: Iterable[Hashable] = (),
                     accounted: Iterable[Hashable] = ()) -> bool:
    """The leader may publish once every live member has joined and every joiner the members
    expect (an admission) is ``accounted`` for: registered, or declared dead."""
    return set(live) <= set(joined) and set(expected) <= set(accounted)


def rendezvous_staleness(staleness: float, heartbeat_period: float, peer_died: bool,
                         beats: float = 3.0) -> float:
    """How long a member that has not joined the rendezvous may be silent and still be waited
    for.

    A gloo connection error means a peer's *process* is gone (its sockets closed), not hung:
    once every other member is in the rendezvous, the silent one is judged after ``beats``
    heartbeat periods instead of the full ``staleness``, so a kill costs about 0.3 s on
    heartbeats alone instead of a whole (longer) staleness. A member that does join is always
    kept, whatever its heartbeat said, so the shorter wait can only cost a member that is both
    silent and absent. Without such evidence (a hang, a death notice) the rule is unchanged.
    Three beats, not two: with two, a live member busy in its step on a loaded 16-group machine
    was left out of a re-form (the soak); with the default 0.3 s staleness this rule now only
    matters for a longer ``--staleness``.
    """
    if not peer_died:
        return staleness
    return min(staleness, beats * heartbeat_period)


def leader_look_s(after_failure: bool, waited_s: float) -> float:
    """How long a rendezvous leader waits before its next look at who has come.

    After a failure the members learn of it within a ms of each other (the doorbell) and come
    a few ms after the leader: a look every ms for the first 20 ms (a 5 ms poll was most of a
    7.6 ms rendezvous at G = 4, bench/rank_groups.py). A member still missing after that is
    late or dead, and at a planned re-form (an admission) they come as they finish the step:
    every 5 ms, as the store's other clients need its turn (at 32 groups a look a ms made an
    admission 0.2 s slower)."""
    return 0.001 if after_failure and waited_s < 0.02 else 0.005


#: a rendezvous leader is judged silent on this many stalenesses, not one: a starved leader
#: still beats (its heartbeat is a thread of its own), and taking over from a live leader
#: leaves it out of the generation
LEADER_SILENCE = 3.0


def leader_gone(leader: Hashable | None, live: Iterable[Hashable], noticed_dead: bool,
                unknown_s: float, staleness: float) -> bool:
    """Whether a member still waiting for the member list takes over the lead.

    ``leader``: who leads now (None: its record was never written, a leader killed between
    counting itself in and writing it, for ``unknown_s`` seconds); ``live``: the members live
    on ``LEADER_SILENCE`` stalenesses; ``noticed_dead``: the leader has a death notice. Taking
    over is always safe (one set-once list decides), so this only trades a spare wait
    against leaving a slow leader out."""
    if leader is None:
        return unknown_s > staleness
    return noticed_dead or leader not in set(live)


def next_members(joined: Iterable[Hashable]) -> list:
    """Member list of the next generation: the distinct joiners, sorted (rank = index)."""
    return sorted(set(joined))


def generation_reports(members: Iterable[Hashable],
                       reports: Mapping[Hashable, object]) -> dict | None:
    """Every member's report of a new generation, or None when one of them offered none.

    All or nothing: the settle reads the reports only when every member can, and every member
    decides from the same published record, so either all of them settle from the reports or
    all of them fall back to the all-reduce."""
    members = list(members)
    if not all(u in reports for u in members):
        return None
    return {u: reports[u] for u in members}


def left_behind(holders: Mapping[Hashable, int], gen: int | float,
                reformed: Iterable[Hashable]) -> list:
    """Slot holders a re-formed generation left out: the launcher evicts them.

    ``holders``: each uid that holds a slot and has been a member of some generation, with
    the first generation it was seen a member of (a spare not yet admitted was never a
    member, so it is never "left behind"); ``gen``: the generation the survivors re-formed;
    ``reformed``: its members. A holder left out whose process still lives is hung (a death
    would have been seen by the launcher first): it must be killed before the spare that takes
    its slot is admitted, or a SIGCONT would bring back a second owner of the slot.

    Only a holder that was a member *before* ``gen`` can be left behind by it. The launcher
    reads each group's journal on its own, so one survivor's line about generation g can
    arrive after another's about g + 1, which admitted a spare; judged on members alone, that
    spare was "left behind" by g and evicted as hung (seen in the suite: a healthy joiner
    killed one step after its admission).
    """
    reformed = set(reformed)
    return sorted(u for u, first in holders.items() if first < gen and u not in reformed)


def wipeout_cover(records: Iterable[tuple[int, bool]], dead_slots: Iterable[int]) -> int | None:
    """How many join records a wipe-out's survivors take, or None while they cannot cover yet.

    ``records`` are the join records in the order the store numbered them, each ``(slot,
    joiner_dead)``; the survivors take the shortest prefix in which every dead slot has a
    joiner that is not known dead. Every survivor reads the same records in the same order, so
    every survivor takes the same prefix and admits the same joiners without a vote.
    """
    need, covered = set(dead_slots), set()
    if not need:
        return 0
    for i, (slot, joiner_dead) in enumerate(records, start=1):
        if not joiner_dead:
            covered.add(int(slot))
        if need <= covered:
            return i
    return None


@dataclass(frozen=True)
class Report:
    """What one member brings into a new generation's settle (see ``settle``)."""

    step: int = -1          # its committed-step counter (-1: a joiner, it has no state yet)
    old: bool = True        # it holds the state (False: a joiner)
    admitted: int = 0       # join records it has dealt with
    joiner_slot: int = -1   # the layout slot a joiner takes over
    planned: bool = False   # it came here for an admission at a step boundary
    plan_gen: int = -1      # the generation whose settle decided its current plan


@dataclass(frozen=True)
class Settle:
    """The one path every member takes after a settle (indices are ranks in the generation).

    ``problem``: None, "no state" (every member is a joiner) or "diverged" (members more
    than one commit apart); ``source``: the rank whose last reduced buffer rolls the members
    at ``lo`` forward (None: all at one step); ``fresh``: take a fresh plan for the live
    slots (an admission, or plans from different generations after a settle that broke half
    way) rather than the failure re-plan."""

    lo: int
    hi: int
    source: int | None
    joiners: dict[int, int]
    admitted: int
    fresh: bool
    problem: str | None
    reason: str


def settle(reports: list[Report]) -> Settle:
    """Everyone's reports in rank order -> the same decision on every member."""
    olds = [i for i, r in enumerate(reports) if r.old]
    joiners = {i: r.joiner_slot for i, r in enumerate(reports) if not r.old}
    if not olds:
        return Settle(-1, -1, None, joiners, 0, True, "no state",
                      f"no member holds the state ({len(reports)} joiners)")
    steps = [reports[i].step for i in olds]
    lo, hi = min(steps), max(steps)
    if hi - lo > 1:
        return Settle(lo, hi, None, joiners, 0, False, "diverged",
                      f"members at steps {steps} after a re-form")
    source = olds[steps.index(hi)] if hi != lo else None
    admitted = max(reports[i].admitted for i in olds)
    gens = {reports[i].plan_gen for i in olds}
    planned = any(r.planned for r in reports)
    fresh = bool(joiners) or planned or len(gens) > 1
    why = ("joiners" if joiners else "an admission" if planned
           else "plans from different generations" if len(gens) > 1 else "a failure")
    reason = (f"settle after {why}: steps {lo}..{hi}"
              + (f", rank {source} rolls the others forward" if source is not None else "")
              + (", fresh plan" if fresh else ", failure re-plan"))
    return Settle(lo, hi, source, joiners, admitted, fresh, None, reason)
