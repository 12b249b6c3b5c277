"""The demo's fault schedule: which group fails how, at which step.

A schedule is written ``kind:group@step`` joined by commas, e.g. ``kill:1@20,hang:3@60,kill:2@61``,
or ``none`` for a failure-free run. ``kill`` ends the group's process (SIGKILL: its peers see it
vanish); ``hang`` freezes it (alive but silent: only the heartbeat timeout can find it).

Validation is strict, like the rest of ``unbroken.core``: a step must lie in ``1..steps-1`` (step 0
is the time origin of the ETTR accounting and the last step has nothing left to protect), a group
in ``0..groups-1``, and a group fails at most once (a dead group cannot die again). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("kill", "hang", "slow", "stall")
# slow: the group turns into a straggler from that step; stall: its training thread blocks for
# good while its heartbeat goes on (only stack aggregation can find it)

_TOKEN = re.compile(r"^\s*([A-Za-z]+)\s*:\s*(-?\d+)\s*@\s*(-?\d+)\s*$")


class FaultSpecError(ValueError):
    """A fault schedule that cannot be run; the message names the bad token and why."""


@dataclass(frozen=True)
class Fault:
    kind: str   # one of KINDS
    group: int  # the group's uid (the layout slot of an original group)
    step: int   # the step during which it fails


def parse_faults(spec: str, groups: int, steps: int) -> list[Fault]:
    """The faults in ``spec`` (``"none"`` -> ``[]``), sorted by step; raises FaultSpecError."""
    text = str(spec).strip()
    if text.lower() == "none":
        return []
    if not text:
        raise FaultSpecError("empty fault spec (use 'none' for a failure-free run, or e.g. "
                             "'kill:1@20,hang:3@60')")
    faults: list[Fault] = []
    first_step: dict[int, int] = {}
    for token in text.split(","):
        m = _TOKEN.match(token)
        if not m:
            raise FaultSpecError(f"fault {token.strip()!r}: malformed (expected kind:group@step, "
                                 f"e.g. kill:1@20)")
        kind, group, step = m.group(1).lower(), int(m.group(2)), int(m.group(3))
        name = token.strip()
        if kind not in KINDS:
            raise FaultSpecError(f"fault {name!r}: unknown kind {kind!r} "
                                 f"(expected {' or '.join(KINDS)})")
        if not 0 <= group < groups:
            raise FaultSpecError(f"fault {name!r}: group {group} out of range 0..{groups - 1}")
        if not 1 <= step < steps:
            raise FaultSpecError(f"fault {name!r}: step {step} out of range 1..{steps - 1}")
        if group in first_step:
            raise FaultSpecError(f"fault {name!r}: duplicate group {group} (it already fails at "
                                 f"step {first_step[group]}; a group can fail once)")
        first_step[group] = step
        faults.append(Fault(kind, group, step))
    return sorted(faults, key=lambda f: f.step)  # stable: ties keep the order given


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
    return ",".join(f"{f.kind}:{f.group}@{f.step}" for f in faults)
