"""From a ladder rung to what the supervisor does: the one mapping, pure.

Why here: the ladder (:mod:`unbroken.core.ladder`) decides *which* rung answers a fault; what a
rung means for the processes of a job (kill this one, send a spare to its slot, start a fresh
process in the same slot, restart everything from the checkpoint after a backoff, stop) is
policy too, and the simulator and the supervisor must agree on it. The supervisor only carries
these actions out, in order; the guard only asks the ladder and hands the actions over.

The mapping (``groups`` are the decision's groups, uids of the processes that hold slots):

==========  ==================================================================================
rung        actions
==========  ==================================================================================
MASK        ``Evict`` each group (the survivors already mask it; a live one is killed) and
            ``Replace`` it from the warm pool at a step boundary (none left: it stays masked)
EVICT       ``Evict`` each group, ``Replace`` the first ``decision.replace`` of them,
            ``Quarantine`` the repeat offenders (never restarted in place again)
RETRY       named groups: ``Evict`` + ``Respawn`` (a fresh process in the same slot; a
            quarantined one gets a spare instead); no group: ``RestartJob``
ROLLBACK,   nothing here: answered in-band by the guard's verdicts (every member recomputes,
REPLAY      replays or hot-swaps its code at one step boundary)
RESTART     ``RestartJob`` from the newest durable checkpoint
REQUEUE     ``RestartJob`` after ``decision.backoff`` seconds, without the named groups
give up     ``StopJob`` with the decision's exit code (6)
==========  ==================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from unbroken.core.ladder import Decision, Rung

__all__ = ["Evict", "Replace", "Respawn", "Quarantine", "RestartJob", "StopJob", "PostCode",
           "PostVerdict", "Action", "actions_for"]


@dataclass(frozen=True)
class Evict:
    """Take ``uid`` out of the job: SIGKILL if it still runs, then a death notice."""

    uid: int
    how: str


@dataclass(frozen=True)
class Replace:
    """The slot ``uid`` held goes to a warm spare (joins at the next step boundary)."""

    uid: int


@dataclass(frozen=True)
class Respawn:
    """The slot ``uid`` held goes to a fresh process started now (retry in place)."""

    uid: int


@dataclass(frozen=True)
class Quarantine:
    """``uid``'s machine offended too often: never restarted in place, not re-admitted."""

    uid: int


@dataclass(frozen=True)
class RestartJob:
    """Every member restarts from the newest durable checkpoint after ``backoff`` seconds;
    ``exclude``: groups not to run again (a requeue's exclusion list)."""

    reason: str
    backoff: float = 0.0
    exclude: tuple[int, ...] = ()


@dataclass(frozen=True)
class StopJob:
    """Every member stops; the job exits with ``code``."""

    code: int
    reason: str


@dataclass(frozen=True)
class PostCode:
    """Code record ``code/<n>``: every member hot-swaps to it at one step boundary."""

    n: int
    record: dict


@dataclass(frozen=True)
class PostVerdict:
    """The guard's answer to a runtime incident (``verdict/<step>/<n>``)."""

    key: str
    verdict: dict


Action = Evict | Replace | Respawn | Quarantine | RestartJob | StopJob | PostCode | PostVerdict


def actions_for(d: Decision, how: str, reason: str = "",
                quarantined: frozenset[int] = frozenset()) -> list[Action]:
    """The actions that carry out decision ``d`` (see the module's table); ``how`` names the
    detector (journaled with each eviction), ``reason`` the ladder's line."""
    groups = tuple(d.groups)
    if d.rung is None:
        return [StopJob(d.exit_code if d.exit_code is not None else 6,
                        reason or "the ladder gave up")]
    if d.rung is Rung.MASK:
        return [a for g in groups for a in (Evict(g, how), Replace(g))]
    if d.rung is Rung.EVICT:
        out: list[Action] = [Evict(g, how) for g in groups]
        out += [Replace(g) for g in groups[:d.replace]]
        out += [Quarantine(g) for g in d.quarantine]
        return out
    if d.rung is Rung.RETRY:
        if not groups:
            return [RestartJob(reason or "retry in place")]
        return [a for g in groups for a in (
            Evict(g, how), Replace(g) if g in quarantined or g in d.quarantine else Respawn(g))]
    if d.rung is Rung.RESTART:
        return [RestartJob(reason or "restart from the checkpoint")]
    if d.rung is Rung.REQUEUE:
        return [RestartJob(reason or "requeue", backoff=d.backoff, exclude=groups)]
    return []  # ROLLBACK, REPLAY: in-band verdicts
