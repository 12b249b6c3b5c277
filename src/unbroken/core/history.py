"""Job history: node exclusions and auto-retry chains, measured from the scheduler's records.

Why: two of the Backend.AI report's four findings are about history, not metrics (backendai.md
§1, §7). **F3**: node exclusions concentrate — the top 3 of 63 nodes account for more than 50 %
— so a scheduler should quarantine repeat offenders rather than re-admit them (the quarantine
rule itself is ``core.exclusion``'s; here it is replayed over the history to name the
candidates). **F4**: automatic retry works better than people do — 12 chains, 73 attempts,
33.3 % of chains succeeded against 12.5 % for manual recovery, with a median retry interval of
11 min (IQR 10-11).

Definitions (the reference's, made exact):

* an **attempt** is one scheduler job of a session (``Attempt``; the sacct reader makes them);
* an attempt **succeeded** when it completed, is still running, or ran at least
  ``healthy_run_s`` (a training job does not "complete" between failures; 30 min of training
  past the restart is recovery);
* a **chain** starts at a failed attempt that was not itself an automatic retry, and collects
  the automatic retries that follow it (``retry == "auto"``; without that mark, a resubmission
  within ``auto_gap_s`` of the previous end counts as automatic) until one succeeds (a chain
  success) or the automatic retries stop (a give-up);
* **manual** attempts are the resubmissions marked ``manual`` (or, unmarked, later than
  ``auto_gap_s``) after a give-up; the manual success rate is succeeded / manual attempts;
* the **retry interval** is an automatic attempt's start minus the previous attempt's end.

Pure: records in, plain data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from unbroken.core.exclusion import ExclusionPolicy, NodeRecord, concentration, quarantined, \
    record_fault

__all__ = ["Attempt", "Exclusion", "exclusion_summary", "Chain", "retry_chains",
           "chain_summary"]


@dataclass(frozen=True)
class Attempt:
    job_id: str
    name: str
    state: str              # COMPLETED, FAILED, NODE_FAIL, RUNNING, CANCELLED, TIMEOUT...
    exit_code: str
    start: float
    end: float | None       # None while running
    nodes: tuple[str, ...] = ()
    submit: float | None = None
    restarts: int = 0
    retry: str = ""         # "auto", "manual" or "" (unknown / first submission)
    excluded: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exclusion:
    node: str
    time: float
    reason: str             # "sacct", "xid", "journal"...


def exclusion_summary(exclusions: Iterable[Exclusion], nodes: Sequence[str] = (),
                      top: int = 3, policy: ExclusionPolicy = ExclusionPolicy()) -> dict:
    """Per-node counts, the share of the ``top`` nodes, and the quarantine candidates (the
    nodes ``core.exclusion`` would have quarantined at some point of the history)."""
    ex = sorted(exclusions, key=lambda e: e.time)
    state: dict = {}
    ever = set()
    for e in ex:
        state, _ = record_fault(state, e.node, e.time, policy)
        ever.update(quarantined(state, e.time, policy))
    counts: dict[str, int] = {}
    for e in ex:
        counts[e.node] = counts.get(e.node, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    n_nodes = len(set(nodes) | set(counts))
    share = concentration({n: NodeRecord(tuple(float(x) for x in range(c)))
                           for n, c in counts.items()}, top) if counts else float("nan")
    return {"total": len(ex), "nodes": n_nodes, "per_node": dict(ranked),
            "top": [n for n, _ in ranked[:top]], "top_share": share,
            "quarantine_candidates": sorted(ever),
            "reason": (f"top {top} of {n_nodes} nodes: {share:.0%} of {len(ex)} exclusions"
                       if counts else "no exclusions")}


def _succeeded(a: Attempt, healthy_run_s: float) -> bool:
    if a.state in ("COMPLETED", "RUNNING") or a.end is None:
        return True
    return a.end - a.start >= healthy_run_s


@dataclass
class Chain:
    name: str
    failed_at: float                          # end of the attempt that started the chain
    attempts: list[Attempt] = field(default_factory=list)   # the automatic retries
    success: bool = False
    manual: list[Attempt] = field(default_factory=list)     # after a give-up
    manual_success: bool = False

    @property
    def recovered_at(self) -> float | None:
        if self.success:
            return self.attempts[-1].start
        if self.manual_success:
            return self.manual[-1].start
        return None


def _failed(a: Attempt) -> bool:
    return a.end is not None and a.state not in ("COMPLETED", "RUNNING")


def retry_chains(attempts: Iterable[Attempt], healthy_run_s: float = 1800.0,
                 auto_gap_s: float = 1200.0) -> list[Chain]:
    """The chains in the history, in time order (per session name)."""
    by_name: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_name.setdefault(a.name, []).append(a)
    chains: list[Chain] = []
    for name, lst in by_name.items():
        lst.sort(key=lambda a: a.start)
        cur: Chain | None = None      # the unresolved chain, if any
        prev: Attempt | None = None
        for a in lst:
            ok = _succeeded(a, healthy_run_s)
            if a.retry:
                auto = a.retry == "auto"
            else:
                auto = (prev is not None and prev.end is not None and _failed(prev)
                        and a.start - prev.end <= auto_gap_s)
            joined = cur is not None
            if cur is not None:
                if auto and not cur.manual:
                    cur.attempts.append(a)
                    cur.success = ok
                else:
                    cur.manual.append(a)
                    cur.manual_success = ok
                if ok:
                    cur = None
            # a failure outside an open chain, or of an attempt that recovered one, starts one
            if _failed(a) and cur is None and (ok or not joined):
                cur = Chain(name, a.end)
                chains.append(cur)
            prev = a
    return sorted(chains, key=lambda c: c.failed_at)


def chain_summary(chains: Sequence[Chain]) -> dict:
    n = len(chains)
    att = sum(len(c.attempts) for c in chains)
    succ = sum(c.success for c in chains)
    manual = [a for c in chains for a in c.manual]
    manual_ok = sum(c.manual_success for c in chains)
    iv = []
    for c in chains:
        prev_end = c.failed_at
        for a in c.attempts:
            iv.append(a.start - prev_end)
            prev_end = a.end if a.end is not None else a.start
    iv_a = np.asarray(iv, float)
    q1, med, q3 = (np.percentile(iv_a, [25, 50, 75]) if len(iv_a) else (np.nan,) * 3)
    rate = succ / n if n else float("nan")
    mrate = manual_ok / len(manual) if manual else float("nan")
    return {"chains": n, "attempts": att, "attempts_per_chain": att / n if n else float("nan"),
            "chain_success": succ, "chain_success_rate": rate,
            "manual_attempts": len(manual), "manual_success": manual_ok,
            "manual_success_rate": mrate,
            "retry_interval_s": {"median": float(med), "q1": float(q1), "q3": float(q3)},
            "reason": (f"{n} chains, {att} automatic attempts, {rate:.1%} of chains "
                       f"succeeded against {mrate:.1%} of manual attempts; retry interval "
                       f"median {med / 60:.1f} min (IQR {q1 / 60:.1f}-{q3 / 60:.1f})")
            if n else "no retry chains"}
