"""The demo's fault schedule: which group fails how, at which step.

A schedule is written ``kind:group@step`` joined by commas, e.g. ``kill:1@20,hang:3@60,kill:2@61``,
or ``none`` for a failure-free run. The kinds:

==========  ======================================================================================
``kill``    the group's process ends (SIGKILL: its peers see it vanish)
``hang``    it freezes (SIGSTOP: alive but silent, only the heartbeat timeout can find it)
``slow``    it turns into a straggler from that step (only the guard's fail-slow detector sees it)
``stall``   its training thread blocks for good while its heartbeat goes on (stack aggregation)
``nan``     one NaN in its gradient at that step, once (an implicit failure: no culprit named)
``flip``    from that step on it corrupts every gradient it computes by one bit (silent data
            corruption: finite, tiny, found only by comparing redundant hosts bit for bit)
``xid``     a GPU XID line for the process holding the group's *slot* then, written to the
            kernel log the guard watches (``xid79:2@50``; plain ``xid`` is XID 79)
``update``  a code update is queued at that step (``update@90``, job-wide): the demo's update is
            a bad one whose training step raises, so only a rollback recovers
``node``    node agent I is SIGKILLed with every process it started (``node:1@30``; only with
            node agents, ``--local-nodes K``: the number names a node, not a group)
``cut``     node agent I is cut off: SIGSTOPped while its workers run on (``cut:1@30``; node
            agents only): only its silent heartbeat can tell
==========  ======================================================================================

A fault names a layout *slot* (an original group's uid is its slot): it hits whichever process
holds the slot when training reaches its step. So a slot can fail again: ``kill:1@10,kill:1@30``
kills group 1 at step 10 and the spare that took slot 1 over at step 30 (if that spare joins
only after step 30, at its first step). Each process injects the faults of its slot up to and
including the first that removes it (``holder_faults``); the rest wait for the next holder.

Validation is strict, like the rest of ``unbroken.core``: a step must lie in ``1..steps-1`` (step 0
is the time origin of the ETTR accounting and the last step has nothing left to protect), a group
in ``0..groups-1``, and a slot loses at most one process per step (two of ``kill``, ``hang``,
``slow``, ``stall``, ``flip`` on one slot and step name one process twice). ``nan`` leaves the
process alive and ``xid`` is written by the launcher, so those may share a step. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

KINDS = ("kill", "hang", "slow", "stall", "nan", "flip", "xid", "update", "node", "cut")
#: kinds that name a node agent, not a group (the launcher's: ``supervise.drill``)
NODE_KINDS = frozenset({"node", "cut"})
#: kinds that end the group's process (its slot's next faults go to the next holder)
REMOVING = frozenset({"kill", "hang", "slow", "stall", "flip"})
#: kinds only an acting guard can recover from (log-only would hang or poison the run)
NEED_ACT = frozenset({"stall", "nan", "flip", "update"})
XID_DEFAULT = 79  # "GPU fell off the bus": the reboot class, evicted at once

_TOKEN = re.compile(r"^\s*([A-Za-z]+)(\d*)\s*(?::\s*(-?\d+)\s*)?@\s*(-?\d+)\s*$")


class FaultSpecError(ValueError):
    """A fault schedule that cannot be run; the message names the bad token and why."""


@dataclass(frozen=True)
class Fault:
    kind: str   # one of KINDS
    group: int  # the layout slot (an original group's uid); update: -1 (job-wide); node: node
    step: int   # the step during which it fails
    code: int | None = None  # xid: the XID number

    @property
    def spec(self) -> str:
        if self.kind == "update":
            return f"update@{self.step}"
        kind = f"xid{self.code}" if self.kind == "xid" else self.kind
        return f"{kind}:{self.group}@{self.step}"


def parse_faults(spec: str, groups: int, steps: int, nodes: int = 0) -> list[Fault]:
    """The faults in ``spec`` (``"none"`` -> ``[]``), sorted by step; raises FaultSpecError.
    ``nodes``: the node agents (0: none, so ``node:`` faults are bad input)."""
    text = str(spec).strip()
    if text.lower() == "none":
        return []
    if not text:
        raise FaultSpecError("empty fault spec (use 'none' for a failure-free run, or e.g. "
                             "'kill:1@20,hang:3@60')")
    faults: list[Fault] = []
    removals: set[tuple[int, int]] = set()
    for token in text.split(","):
        m = _TOKEN.match(token)
        if not m:
            raise FaultSpecError(f"fault {token.strip()!r}: malformed (expected kind:group@step, "
                                 f"e.g. kill:1@20)")
        kind, digits, step = m.group(1).lower(), m.group(2), int(m.group(4))
        name = token.strip()
        if kind not in KINDS:
            raise FaultSpecError(f"fault {name!r}: unknown kind {kind!r} "
                                 f"(expected {', '.join(KINDS)})")
        if digits and kind != "xid":
            raise FaultSpecError(f"fault {name!r}: only xid takes a number ({kind}{digits})")
        if (m.group(3) is None) != (kind == "update"):
            raise FaultSpecError(f"fault {name!r}: malformed (expected kind:group@step, or "
                                 f"update@step)")
        group = -1 if kind == "update" else int(m.group(3))
        code = (int(digits) if digits else XID_DEFAULT) if kind == "xid" else None
        if kind in NODE_KINDS and not 0 <= group < nodes:
            raise FaultSpecError(f"fault {name!r}: node {group} out of range 0..{nodes - 1}"
                                 if nodes else f"fault {name!r}: a node fault needs node "
                                 f"agents (--local-nodes K)")
        if kind != "update" and kind not in NODE_KINDS and not 0 <= group < groups:
            raise FaultSpecError(f"fault {name!r}: group {group} out of range 0..{groups - 1}")
        if not 1 <= step < steps:
            raise FaultSpecError(f"fault {name!r}: step {step} out of range 1..{steps - 1}")
        if kind in REMOVING:
            if (group, step) in removals:
                raise FaultSpecError(f"fault {name!r}: slot {group} already loses its process "
                                     f"at step {step} (a slot fails again at a later step)")
            removals.add((group, step))
        fault = Fault(kind, group, step, code)
        if fault in faults:
            raise FaultSpecError(f"fault {name!r}: listed twice")
        faults.append(fault)
    return sorted(faults, key=lambda f: f.step)  # stable: ties keep the order given


def holder_faults(pending: list[Fault], slot: int) -> list[Fault]:
    """What the next process to hold ``slot`` injects: the slot's ``pending`` worker faults in
    step order, up to and including the first that removes it (the ones after it belong to the
    holder after that). ``xid`` and ``update`` are the launcher's (``supervise.drill``)."""
    out: list[Fault] = []
    for f in sorted((f for f in pending if f.group == slot
                     and f.kind not in ("xid", "update", "node", "cut")),
                    key=lambda f: f.step):
        out.append(f)
        if f.kind in REMOVING:
            break
    return out


def default_faults(groups: int, steps: int) -> list[Fault]:
    """A kill, a hang, and two failures close together, scaled to the run.

    Steps at 10 %, 30 % and 30 % + 1 of the run, groups 1, groups-1 and 2; for 4 groups and
    200 steps exactly ``kill:1@20,hang:3@60,kill:2@61``. Faults that do not fit a small run
    (a missing group, a repeated group, a step outside 1..steps-1) are left out, never made invalid.
    """
    s1 = (steps * 10 + 50) // 100  # integer rounding: no float surprises at 0.1 * 200
    s2 = (steps * 30 + 50) // 100
    wanted = [("kill", 1, max(1, s1)), ("hang", groups - 1, max(1, s2)),
              ("kill", 2, max(1, s2) + 1)]
    out: list[Fault] = []
    used: set[int] = set()
    for kind, group, step in wanted:
        if 0 <= group < groups and group not in used and 1 <= step < steps:
            used.add(group)
            out.append(Fault(kind, group, step))
    return sorted(out, key=lambda f: f.step)


def format_faults(faults: list[Fault]) -> str:
    """The spec text of ``faults``: the inverse of :func:`parse_faults`."""
    if not faults:
        return "none"
    return ",".join(f.spec for f in faults)


#: the chaos run's XIDs: two evict-at-once classes and two restart-in-place ones (backendai §3)
CHAOS_XIDS = (79, 119, 43, 31)


def chaos_faults(seed: int, groups: int, steps: int) -> list[Fault]:
    """A seeded mix of every kind the guard handles: kill, hang, slow, flip (each on its own
    group, as many as there are groups), one nan, one xid and one code update.

    Steps are spread over 8 %..85 % of the run, one fault per equal window with a seeded offset
    in its first third, so incidents rarely overlap and a short run still gets all of them; the
    nan goes to a group that is still alive at its step, the XID to the slot of the group
    killed earlier (a spare holds it then, so every fault fires and each hits a different
    process). Same seed, same schedule.
    """
    rng = np.random.default_rng([int(seed), 0xC4A05])
    removing = ["kill", "hang", "slow", "flip"][:groups]
    kinds = [str(k) for k in rng.permutation(removing + ["nan", "xid", "update"])]
    for _ in range(len(kinds)):  # a few swaps settle both orderings
        k, x, n = kinds.index("kill"), kinds.index("xid"), kinds.index("nan")
        last = max(i for i, kind in enumerate(kinds) if kind in REMOVING)
        if x < k:  # the XID hits the killed group's slot, held by its spare by then
            kinds[k], kinds[x] = kinds[x], kinds[k]
        elif n > last:  # some original group must still be alive for the nan
            kinds[n], kinds[last] = kinds[last], kinds[n]
        else:
            break
    lo, hi = max(1, steps * 8 // 100), max(2, steps * 85 // 100)
    width = max(1, (hi - lo) // len(kinds))
    at = [min(steps - 1, lo + i * width + int(rng.integers(0, max(1, width // 3))))
          for i in range(len(kinds))]
    victims = [int(g) for g in rng.permutation(groups)[:len(removing)]]
    gone = {}  # group -> step its process is removed
    out: list[Fault] = []
    for kind, step in zip(kinds, at):
        if kind in REMOVING:
            g = victims.pop(0)
            gone[g] = step
            out.append(Fault(kind, g, step))
    for kind, step in zip(kinds, at):
        if kind == "nan":
            alive = [g for g in range(groups) if gone.get(g, steps) > step]
            out.append(Fault("nan", int(rng.choice(alive)), step))
        elif kind == "xid":  # the killed group's slot: its spare holds it by then (a hang,
            #                      straggler or flip is removed only once detected)
            killed = next(f.group for f in out if f.kind == "kill")
            out.append(Fault("xid", killed, step, int(rng.choice(CHAOS_XIDS))))
        elif kind == "update":
            out.append(Fault("update", -1, step))
    return sorted(out, key=lambda f: f.step)


#: the soak's mix (``soak_faults``): relative weights of the kinds after one of each
SOAK_WEIGHTS = {"kill": 6, "hang": 4, "nan": 2, "slow": 2, "flip": 2, "stall": 1, "xid": 2,
                "update": 1}
#: steps a slot is left alone after a fault: a kill or hang is masked and refilled within a few
#: steps; a straggler, a bit flip or a stall holds its slot until the guard's detector has seen
#: enough of it
SOAK_COOLDOWN = {"kill": 10, "hang": 10, "nan": 10, "xid": 10, "slow": 40, "flip": 40,
                 "stall": 40}
#: fewest steps between two faults of a soak
SOAK_SPACING = 4


def soak_faults(seed: int, groups: int, steps: int, count: int) -> list[Fault]:
    """``count`` seeded faults of every kind the guard answers, for a soak: one of each kind
    first (when ``count`` allows), the rest drawn by ``SOAK_WEIGHTS``, spread evenly over
    5 %..90 % of the run with a seeded offset. Slots fail again and again: each fault goes to a
    slot left alone for ``SOAK_COOLDOWN`` steps (the least recently hit one when none is), so
    a slot's replacement is hit as its original was. Same seed, same schedule; raises
    FaultSpecError when the run is too short for ``count`` faults."""
    if count < 1:
        raise FaultSpecError(f"--chaos-faults {count}: must be at least 1")
    lo, hi = max(1, steps * 5 // 100), steps * 90 // 100
    if hi - lo < count * SOAK_SPACING:
        raise FaultSpecError(f"--chaos-faults {count}: needs at least "
                             f"{(count * SOAK_SPACING + 1) * 100 // 85 + 1} steps "
                             f"(--steps {steps})")
    rng = np.random.default_rng([int(seed), int(count), 0x50A4])
    names = list(SOAK_WEIGHTS)
    weights = np.array([SOAK_WEIGHTS[k] for k in names], dtype=float)
    kinds = names[:count] + [str(k) for k in rng.choice(
        names, size=max(0, count - len(names)), p=weights / weights.sum())]
    kinds = [str(k) for k in rng.permutation(kinds)]
    width = (hi - lo) / count
    at = [lo + int(i * width) + int(rng.integers(0, max(1, int(width) - SOAK_SPACING + 1)))
          for i in range(count)]
    free = {g: 0 for g in range(groups)}  # slot -> first step it may be hit again
    out: list[Fault] = []
    for kind, step in zip(kinds, at):
        if kind == "update":
            out.append(Fault("update", -1, step))
            continue
        ready = [g for g in range(groups) if free[g] <= step]
        g = int(rng.choice(ready)) if ready else min(free, key=lambda s: (free[s], s))
        free[g] = step + SOAK_COOLDOWN[kind]
        out.append(Fault(kind, g, step, int(rng.choice(CHAOS_XIDS)) if kind == "xid" else None))
    return sorted(out, key=lambda f: f.step)
