"""The exactly-once ledger read back from the journals (pure: no torch).

:func:`ledger_records` turns every group's journal into the (step, type, group) contributions
of the committed steps; :func:`unbroken.core.shards.exactly_once` then checks that each shard
type of each step was counted once. :class:`DivergenceError` is what the runner raises when the
in-band check of a completed all-reduce fails, and what the ledger raises when journals
disagree on a committed step.
"""

from __future__ import annotations

from unbroken.core.shards import LedgerReport, exactly_once
from unbroken.events import Event

__all__ = ["DivergenceError", "check_ledger", "ledger_records"]


class DivergenceError(RuntimeError):
    """The in-band check of a completed all-reduce failed (members at different steps, or a
    shard type missing / counted twice)."""


def ledger_records(journals: dict[int, list[dict]],
                   orphans: list[tuple[int, int]] | None = None) -> list[tuple[int, int, int]]:
    """(step, type, group) contributions of every committed step, from all journals.

    A step's contributions are its committed plan (type -> contributing group), checked
    in-band by the coverage vector; every journal that committed the step must agree on it
    (else :class:`DivergenceError`). Using the plan rather than each group's own record keeps
    a group that died between the all-reduce and its journal line counted, and a group's
    ``mine`` must match the plan. A ``restore`` to step c (a roll-back) discards commits of
    steps >= c made before it.

    A member cut off from the others (its link went down, its node was fenced) can see the
    op of step k complete while every other member sees it fail: it commits k alone, in the
    old generation, and never reaches the others again; they re-plan k without it and commit
    a different plan in a later generation. Such an *orphan* commit is superseded, not a
    divergence: a commit of k in generation g loses to one in a later generation whose
    members include none of g's committers of k (their state left the job with them). The
    same plans disagreeing inside one generation, or with a committer that lives on, still
    raise. ``orphans`` (optional) receives the (step, group) of each superseded commit.

    ``--sync ksync:K`` (``unbroken.runtime.syncmodes``): a commit's plan leaves out the types
    it ``deferred``, and its ``catch_up`` lists ``[data step, type, group]`` of earlier steps'
    deferred shards used by it: they count for their data step.
    """
    events = sorted(((e["t"], g, e) for g, evs in journals.items() for e in evs
                     if e.get("event") in (Event.COMMIT, Event.RESTORE)), key=lambda x: x[0])
    plans: dict[int, dict] = {}
    late: dict[int, list] = {}  # commit step -> its catch-up records
    who: dict[int, list[tuple[int, dict]]] = {}  # commit step -> (group, commit) behind its plan
    for _t, g, e in events:
        if e["event"] == Event.RESTORE:
            plans = {k: p for k, p in plans.items() if k < e["step"]}
            late = {k: c for k, c in late.items() if k < e["step"]}
            who = {k: w for k, w in who.items() if k < e["step"]}
            continue
        k, plan = e["step"], e["plan"]
        if plans.setdefault(k, plan) != plan:
            if _supersedes(e, who[k]):
                if orphans is not None:
                    orphans.extend((k, w) for w, _c in who[k])
                plans[k], who[k] = plan, []
                late.pop(k, None)
            elif all(_supersedes(c, [(g, e)]) for _g, c in who[k]):
                if orphans is not None:
                    orphans.append((k, g))
                continue  # e is the orphan, journaled after the others' re-plan
            else:
                raise DivergenceError(f"step {k}: groups committed different plans")
        who.setdefault(k, []).append((g, e))
        if "catch_up" in e and late.setdefault(k, e["catch_up"]) != e["catch_up"]:
            raise DivergenceError(f"step {k}: groups committed different catch-ups")
        if any(plan.get(str(t)) != g for t in e["mine"]):
            raise DivergenceError(f"step {k}: group {g} journaled types {e['mine']} that the "
                                  f"plan {plan} gives to others")
    return [(k, int(t), int(w)) for k, plan in sorted(plans.items()) for t, w in plan.items()] + \
        [(int(s), int(t), int(w)) for _k, cu in sorted(late.items()) for s, t, w in cu]


def check_ledger(journals: dict[int, list[dict]], steps: int, groups: int,
                 orphans: list[tuple[int, int]] | None = None
                 ) -> tuple[LedgerReport, str | None]:
    """The exactly-once verdict over ``steps`` steps, and one line when the journals disagree
    (then the verdict is "no": what the job did cannot be read back, which is never a
    traceback at the end of a run that trained). ``orphans`` (optional) receives the
    (step, group) of every orphan commit that was superseded."""
    try:
        return exactly_once(ledger_records(journals, orphans), steps, groups), None
    except DivergenceError as exc:
        rep = exactly_once([], steps, groups)
        return rep, f"the journals disagree on what was committed: {exc}"


def _supersedes(commit: dict, others: list[tuple[int, dict]]) -> bool:
    """``commit`` replaces the commits ``others`` of its step: they are orphans of members cut
    off in an earlier generation, none of them a member of ``commit``'s generation."""
    gen, members = commit.get("gen"), set(commit.get("members") or ())
    return gen is not None and all(
        c.get("gen") is not None and c["gen"] < gen and g not in members for g, c in others)
