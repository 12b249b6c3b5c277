"""ETTR accounting of a demo run from its journal events (pure: no I/O, no clock).

ETTR (effective training time ratio, as in ByteRobust) is productive time over elapsed time.
Definitions used here, all derived from the journal:

* **Commit time of a step** -- the FIRST ``commit`` event of that step across groups (every live
  group journals each committed step; the first one is when the step was done). After a
  wipe-out ``restart`` the run resumes at an earlier step; commits of steps already committed
  before are *redone* work and make no progress.
* **Timeline** -- the commit times in time order: ``(t_0, step_0), (t_1, step_1), ...``;
  interval ``i`` is ``(t_{i-1}, t_i]``.
* **step_s** (failure-free step time) -- the median length of the *clean* intervals: from step
  ``k-1`` to step ``k`` with no fault/detected/replan/wipeout/restart/join event inside. Only clean
  intervals before the first failure are used when there are at least ``MIN_BASELINE`` (8) of
  them: after a masked failure a survivor computes a stack of several shard types per step, so
  later steps are slower, and that degradation is a cost of the failure, not the failure-free
  baseline. Fewer than 8 are mostly a run's warm-up and overstate the step; the whole run's
  clean median is used then. (Taking the faster of the two medians instead read ETTR 0.41 for
  0.73 at 16 groups on 2 cores, where the steps after kills are *faster*: fewer processes share
  the cores.)
* **Origin** -- ``t_0 - step_s``: step 0 is charged one failure-free step. Process start-up
  (spawn, imports, rendezvous, model build) is not training time and is excluded.
* **wall_s** -- ``t_last - origin`` (the ETTR denominator; the demo's whole wall time is larger).
* **productive_s** -- distinct committed steps x ``step_s``. ``ettr = productive_s / wall_s``,
  clipped to [0, 1] (steps faster than the median can push it a hair above 1).
* **Excess of interval i** -- ``(t_i - t_{i-1}) - step_s`` when it commits a new step, the whole
  interval when it redoes one. The excesses sum to ``wall_s - productive_s`` exactly.
* **Time lost to a fault** (``lost_s``) -- the summed excess of the intervals from the one the
  fault was injected in up to the one that next commits a new step after its resolution (the
  replan that masked it, an admission whose generation leaves the process out -- an evicted
  straggler whose spare joined in the same re-form --, or the restart). An interval is charged to one fault only, so two
  failures resolved together are not counted twice: the intervals from a fault's answer (its
  replan, restart -- a wipe-out's or a guard's restore -- or the guard's ``resolved``) to the
  next new step go to the fault answered (a roll-back's -- a restore or a restart -- first,
  then the others, each the earliest answered first), so the restore and the redone steps are
  the cost of the fault that restore answers, not of an earlier one still open, nor of one
  answered just before it (a replan) whose next step the restore threw away, nor of a restart
  just after it to the same step; every other interval goes to the earliest fault whose window
  holds it. What no fault
  window covers (degraded steps after masking, joins, jitter) is ``other_lost_s``.
* **Breakdown** of a masked fault: ``detect_s = reform_at - t_fault`` (the first replan's reform
  started when a peer's all-reduce failed), ``decide_s = replan.t - reform_at`` (reform + plan),
  ``recompute_s = max(0, commit.t - replan.t - step_s)`` (patched gradients beyond a normal step;
  the next commit after the replan, a redone step too).
  Of a restarted one: ``detect_s`` up to the first of (wipeout.reform_at, driver ``detected``,
  wipeout, restart), ``decide_s`` from there to the wipeout/restart decision, ``restart_s =
  t_ready - wipeout.t`` (restore from the snapshot/checkpoint), ``recompute_s`` from ready to the
  next new step minus ``step_s`` (redone steps included). Unknown parts are None.
  A fault the guard answers (``nan``, ``flip``, ``update``, ``xid``: kinds whose incident the
  runtime reports, see ``RESOLVED_BY``) ends at the guard's first ``resolved`` event for that
  incident kind: ``detect_s = detected_t - t_fault``, ``decide_s = t - detected_t``; a
  resolution that restored a checkpoint (``restart``) is not masked.
* **A one-step corruption absorbed** (``nan``, see ``ABSORBABLE``): when another failure broke
  the op of the step the NaN was injected into, the survivors' replan recomputed that step's
  gradients and the NaN never reached a commit: no member journals its incident. With a
  ``replan`` of that step after the fault and no incident of its kind at that step, the fault
  is masked, ``how`` "absorbed by ...", and charged nothing (the replan is the other fault's).
* **Which fault a restart answers** -- the guard's restore journals a ``restart`` naming its
  ``incident`` (older journals: a ``restart`` at the time of a ``resolved`` line with
  ``restart``); it answers that incident's fault only, never another fault still open (a slow
  group, a kill awaiting its replan). Any other restart (a wipe-out's) answers the open faults.
* **A fault noticed late** (``external``: a real failure, journaled when the supervisor learns
  of it -- a remote node's silence can take longer than the survivors' own heartbeat rule): its
  answer may come first, so the search starts when the process was last named a member, and
  the fault is dated no later than that answer's reform.
* **masked** -- the fault was resolved without a restart and training went on past its step.
* **series** -- per timeline point ``(t - origin, cumulative ETTR, ETTR over the last W
  intervals)``, for plotting.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from unbroken.events import Event

# events that mark an interval as not failure-free
_FAILURE = frozenset({Event.FAULT, Event.DETECTED, Event.REPLAN, Event.WIPEOUT, Event.RESTART,
                      Event.INCIDENT})
_DISRUPTIVE = _FAILURE | {Event.JOIN}
#: injected fault kind -> the incident kind whose ``resolved`` event ends it
RESOLVED_BY = {"nan": "implicit", "flip": "sdc", "update": "code", "xid": "xid"}
#: kinds that corrupt one computation of one step only: a recompute of that step erases them
ABSORBABLE = frozenset({"nan"})
#: pre-failure clean intervals needed before they alone define step_s: a run's first steps warm
#: up, and 4 of them (a kill at the demo's step 5) read 0.088 s against a 0.05 s steady step,
#: so productive time exceeded wall time and ETTR read 1.0 with three faults
MIN_BASELINE = 8


@dataclass(frozen=True)
class FaultCost:
    kind: str
    group: int
    step: int
    lost_s: float
    detect_s: float | None
    decide_s: float | None
    recompute_s: float | None
    restart_s: float | None
    masked: bool
    t_rel: float = 0.0  # injection time since the origin (for markers on a time axis)
    how: str = ""       # how it was resolved, in words ("replan (phase fixed, depth 2)")
    rung: str | None = None  # the runtime's answer as a ladder rung: "mask" (a replan), "restart"
    #                          (a wipe-out / restart); None when the guard resolved it (its rung
    #                          is in the journal's ``ladder`` events)


@dataclass(frozen=True)
class EttrReport:
    ettr: float
    wall_s: float
    productive_s: float
    step_s: float
    faults: list[FaultCost]
    series: list[tuple[float, float, float]]
    steps: int = 0            # distinct committed steps
    lost_s: float = 0.0       # wall_s - productive_s
    other_lost_s: float = 0.0  # lost time in no fault's window
    origin_t: float = 0.0     # absolute time of the origin
    window: int = 20
    restarts: int = 0
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss of its last commit


def _num(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None  # NaN counts as missing


def _timed(events: list[dict]) -> list[dict]:
    """Events with a numeric time, in time order (stable for ties)."""
    out = [e for e in events if isinstance(e, dict) and _num(e.get("t")) is not None]
    return sorted(out, key=lambda e: float(e["t"]))


def timeline(events: list[dict]) -> list[tuple[float, int, bool]]:
    """``(t, step, new)`` per first commit of a step since the last restart, in time order;
    ``new`` is False for a step that had been committed before (redone after a restart)."""
    # a restart starts a new epoch: both its line (written after the wipe-out) and t_ready come
    # after every old commit, and t_ready precedes every new one, so the earlier of the two
    # separates the epochs whenever the driver wrote the line
    marks: list[tuple[float, int, int]] = []
    for e in _timed(events):
        ev = e.get("event")
        if ev == Event.RESTART:
            ready = _num(e.get("t_ready"))
            marks.append((min(float(e["t"]), ready if ready is not None else float(e["t"])),
                          0, -1))
        elif ev == Event.COMMIT and isinstance(e.get("step"), int):
            marks.append((float(e["t"]), 1, e["step"]))
    marks.sort(key=lambda m: (m[0], m[1]))
    out: list[tuple[float, int, bool]] = []
    seen_epoch: set[int] = set()
    done: set[int] = set()
    for t, kind, k in marks:
        if kind == 0:
            seen_epoch = set()
        elif k not in seen_epoch:
            seen_epoch.add(k)
            out.append((t, k, k not in done))
            done.add(k)
    return out


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _step_time(tl: list[tuple[float, int, bool]],
               disruptions: list[tuple[float, str]]) -> float:
    first_failure = min((t for t, ev in disruptions if ev in _FAILURE), default=float("inf"))
    times = sorted(t for t, _ in disruptions)
    clean, clean_pre, stepwise = [], [], []
    j = 0
    for i in range(1, len(tl)):
        (t0, k0, _), (t1, k1, _) = tl[i - 1], tl[i]
        if k1 != k0 + 1:
            continue
        stepwise.append(t1 - t0)
        while j < len(times) and times[j] <= t0:
            j += 1
        if j < len(times) and times[j] <= t1:
            continue  # a disruption inside (t0, t1]
        clean.append(t1 - t0)
        if t1 <= first_failure:
            clean_pre.append(t1 - t0)
    for xs in (clean_pre if len(clean_pre) >= MIN_BASELINE else [], clean, stepwise):
        if xs:
            return _median(xs)
    return 0.0


def _first(events, pred, after: float):
    for e in events:
        if float(e["t"]) >= after and pred(e):
            return e
    return None


def _absorbed_by(evs: list[dict], f: dict, incident: str | None, tf: float) -> dict | None:
    """The replan that recomputed the step of a one-step corruption ``f`` before any member
    found it (``ABSORBABLE``), or None: a ``replan`` of ``f``'s step after it, and no
    ``incident`` of its kind at that step."""
    k = f.get("step")
    if f.get("kind") not in ABSORBABLE or not isinstance(k, int) or any(
            e.get("event") == Event.INCIDENT and e.get("step") == k and e.get("kind") == incident
            for e in evs):
        return None
    return _first(evs, lambda e: e.get("event") == Event.REPLAN and e.get("step") == k, tf)


def _member_since(evs: list[dict], g, before: float) -> float:
    """When ``g`` was last named a member (a replan, join or wipe-out listing it) at or before
    ``before``; the journal's start if never: an answer after that can be its fault's."""
    since = float(evs[0]["t"]) if evs else before
    for e in evs:
        t = float(e["t"])
        if t > before:
            break
        members = e.get("members")
        if isinstance(members, list) and g in members:
            since = t
    return since


def _guard_restarts(evs: list[dict]) -> set[int]:
    """``id()`` of the ``restart`` events that answer a guard incident (see the docstring)."""
    restored = {float(e["t"]) for e in evs if e.get("event") == Event.RESOLVED and e.get("restart")}
    return {id(e) for e in evs if e.get("event") == Event.RESTART and
            (e.get("incident") is not None or float(e["t"]) in restored)}


def ettr_report(events: list[dict], *, window: int = 20) -> EttrReport:
    """ETTR, time lost per fault and the ETTR series of a journal (see the module docstring)."""
    evs = _timed(events)
    tl = timeline(evs)
    disruptions = [(float(e["t"]), e["event"]) for e in evs if e.get("event") in _DISRUPTIVE]
    step_s = _step_time(tl, disruptions)
    losses: dict[int, float] = {}
    for e in evs:
        if e.get("event") == Event.COMMIT and isinstance(e.get("step"), int):
            loss = _num(e.get("loss"))
            if loss is not None:
                losses[e["step"]] = loss
    restarts = sum(1 for e in evs if e.get("event") == Event.RESTART)
    if not tl:
        faults = [FaultCost(e.get("kind", "?"), e.get("group", -1), e.get("step", -1), 0.0,
                            None, None, None, None, False)
                  for e in evs if e.get("event") == Event.FAULT]
        return EttrReport(1.0 if not faults else 0.0, 0.0, 0.0, step_s, faults, [],
                          restarts=restarts, window=window)
    origin = tl[0][0] - step_s
    times = [t for t, _, _ in tl]
    excess = [0.0] + [(tl[i][0] - tl[i - 1][0]) - (step_s if tl[i][2] else 0.0)
                      for i in range(1, len(tl))]
    n_new = sum(1 for *_, new in tl if new)
    wall = tl[-1][0] - origin
    productive = n_new * step_s
    ettr = min(1.0, max(0.0, productive / wall)) if wall > 0 else 1.0

    # series: cumulative and sliding-window ETTR at every commit
    series: list[tuple[float, float, float]] = []
    new_prefix = [0]
    for _, _, new in tl:
        new_prefix.append(new_prefix[-1] + (1 if new else 0))
    for i, (t, _, _) in enumerate(tl):
        cum = (new_prefix[i + 1] * step_s) / (t - origin) if t > origin else 1.0
        j = i - window
        t_start, new_in = (times[j], new_prefix[i + 1] - new_prefix[j + 1]) if j >= 0 else \
            (origin, new_prefix[i + 1])
        win = new_in * step_s / (t - t_start) if t > t_start else 1.0
        series.append((t - origin, min(1.0, max(0.0, cum)), min(1.0, max(0.0, win))))

    # per-fault costs
    guard_restarts = _guard_restarts(evs)
    costs: list[FaultCost] = []
    # (i0, i1, answered at, the answer rolled back: a restore or a restart)
    windows: list[tuple[int | None, int | None, float | None, bool]] = []

    def idx_after(t: float) -> int | None:
        for i, ti in enumerate(times):
            if ti >= t:
                return i
        return None

    def first_new_after(t: float) -> int | None:
        for i, (ti, _, new) in enumerate(tl):
            if ti > t and new:
                return i
        return None

    for f in (e for e in evs if e.get("event") == Event.FAULT):
        # members and detections name processes (uids); a slot's replacement has a uid of its own
        tf, g, kf = float(f["t"]), f.get("uid", f.get("group")), f.get("step")

        def resolves(e, g=g) -> bool:
            # a replan/wipe-out whose members still include g answered something else (a
            # momentarily starved heartbeat, an earlier fault): skip it; so does a guard's
            # restore (it answers the guard's incident, see RESOLVED_BY)
            if e.get("event") == Event.RESTART:
                return id(e) not in guard_restarts
            members = e.get("members")
            if e.get("event") == Event.ADMIT:
                # an evicted process's spare admitted: the generation it forms leaves g out
                return isinstance(members, list) and g not in members
            return e.get("event") in (Event.REPLAN, Event.WIPEOUT) and not (
                isinstance(members, list) and g in members)

        incident = RESOLVED_BY.get(f.get("kind"))
        if incident is not None:
            res = _first(evs, lambda e, i=incident: e.get("event") == Event.RESOLVED
                         and e.get("incident") == i, tf)
        else:
            res = _first(evs, resolves, _member_since(evs, g, tf) if f.get("external") else tf)
            if res is not None and f.get("external"):
                # noticed after the survivors had answered it: it happened by then
                tf = min([tf, float(res["t"])] + [
                    x for x in (_num(e.get("reform_at")) for e in evs
                                if e.get("event") == res["event"] and
                                e.get("step") == res.get("step") and
                                e.get("gen") == res.get("gen")) if x is not None])
        detected = _first(evs, lambda e: e.get("event") == Event.DETECTED and e.get("group") == g,
                          tf)
        detect = decide = recompute = restart_s = None
        end_t: float | None = None
        next_commit = False  # recompute up to the next commit (a replan's patched step)
        masked, how, rung = False, "unresolved", None
        absorbed = _absorbed_by(evs, f, incident, tf) if res is None else None
        if absorbed is not None:
            masked, rung = True, "mask"
            how = (f"absorbed by the replan of step {kf} (its gradients recomputed, the "
                   f"corruption never committed)")
        elif res is not None and res["event"] == Event.RESOLVED:
            seen = _num(res.get("detected_t"))
            end_t = float(res["t"])
            if seen is not None:
                detect, decide = max(0.0, seen - tf), max(0.0, end_t - seen)
            masked = not res.get("restart", False)
            restart_s = 0.0 if res.get("restart") else None
            how = str(res.get("how", "resolved"))
        elif res is not None and res["event"] in (Event.REPLAN, Event.ADMIT):
            rt = float(res["t"])
            # several groups journal the same replan: take the earliest reform start
            same = [e for e in evs if e.get("event") == res["event"] and e.get("step") ==
                    res.get("step") and e.get("gen") == res.get("gen")]
            reform = min((_num(e.get("reform_at")) for e in same
                          if _num(e.get("reform_at")) is not None), default=None)
            if reform is not None:
                detect, decide = max(0.0, reform - tf), max(0.0, rt - reform)
            end_t = rt
            masked, next_commit = True, True
            how = (f"replan (phase {res.get('phase', '?')}, depth {res.get('depth', '?')})"
                   if res["event"] == Event.REPLAN else
                   "replan at an admission (" + ", ".join(
                       f"uid {u} -> slot {s}" for u, s in dict(res.get("joined") or {}).items())
                   + ")")
            rung = "mask"
        elif res is not None:
            wipe = res if res["event"] == Event.WIPEOUT else None
            restart = res if res["event"] == Event.RESTART else \
                _first(evs, lambda e: e.get("event") == Event.RESTART and
                       id(e) not in guard_restarts, float(res["t"]))
            marks = [x for x in (_num(wipe.get("reform_at")) if wipe else None,
                                 float(detected["t"]) if detected else None,
                                 float(res["t"])) if x is not None]
            d_end = min(marks)
            detect = max(0.0, d_end - tf)
            decide = max(0.0, float(res["t"]) - d_end)
            end_t = float(res["t"])
            how, rung = "wipe-out", "restart"
            if restart is not None:
                ready = _num(restart.get("t_ready"))
                ready = ready if ready is not None else float(restart["t"])
                restart_s = max(0.0, ready - float(res["t"]))
                end_t = ready
                how = (f"restart from {restart.get('source', 'memory')} "
                       f"@ step {restart.get('step', '?')}")
        i0 = idx_after(tf)
        i1 = first_new_after(end_t) if end_t is not None else i0
        ir = idx_after(end_t) if next_commit and end_t is not None else i1
        if ir is not None and end_t is not None:
            rec = tl[ir][0] - end_t - step_s
            recompute = max(0.0, rec)
        if masked and (i1 is None or (isinstance(kf, int) and
                                      max(k for _, k, _ in tl) < kf)):
            masked = False  # training never went past the failing step
        rolled_back = res is not None and (res["event"] in (Event.WIPEOUT, Event.RESTART) or (
            res["event"] == Event.RESOLVED and bool(res.get("restart"))))
        windows.append((i0, i1, float(res["t"]) if res is not None else None, rolled_back))
        slot = f.get("group")
        costs.append(FaultCost(f.get("kind", "?"), slot if isinstance(slot, int) else -1,
                               kf if isinstance(kf, int) else -1, 0.0, detect,
                               decide, recompute, restart_s, masked, tf - origin, how, rung))

    # lost time: each interval to one fault; from a fault's answer to its next new step to that
    # fault -- the roll-backs first (a restore throws away the step an earlier replan was about
    # to commit: the redone steps are the restore's), then the other answers, each the earliest
    # first (a restart to the step a restore already went back to adds its own time only) --,
    # then the rest of every window to the earliest fault
    claimed: set[int] = set()
    lost = [0.0] * len(costs)

    def claim(n: int, lo: int | None, hi: int | None) -> None:
        if lo is None:
            return
        for i in range(lo, (hi if hi is not None else len(tl) - 1) + 1):
            if i not in claimed:
                claimed.add(i)
                lost[n] += excess[i]

    answered = sorted((not back, at, n) for n, (_, _, at, back) in enumerate(windows)
                      if at is not None)
    for *_, n in answered:
        i0, i1, at, _ = windows[n]
        ia = idx_after(at)
        if i0 is not None and ia is not None:
            claim(n, max(i0, ia), i1)
    for n, (i0, i1, _, _) in enumerate(windows):
        claim(n, i0, i1)
    costs = [replace(c, lost_s=max(0.0, x)) for c, x in zip(costs, lost)]
    lost_total = wall - productive
    return EttrReport(ettr, wall, productive, step_s, costs, series, steps=n_new,
                      lost_s=lost_total, other_lost_s=lost_total - sum(c.lost_s for c in costs),
                      origin_t=origin, window=window, restarts=restarts, losses=losses)
