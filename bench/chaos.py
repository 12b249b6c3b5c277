"""The chaos demo over several seeds: every fault kind, the rung that answered it, its cost.

Each seed ``s`` in ``0..--seeds-1`` runs ``unbroken.demo.run_demo`` with
``demo_spec(chaos=s, ft=FTConfig(guard="act"), steps=--steps)``: 4 data-parallel worker
processes (r = 2, the GPT) through the seeded mix of ``unbroken.core.faults.chaos_faults``
(kill, hang, slow, nan, flip, xid, update), each run in its own out dir under a temp dir
(``--workdir`` keeps them). Per run: the fault spec, ETTR, exactly-once, the max |param -
failure-free reference|, wall time, and per fault its kind, step, the ladder rung(s) that
answered it, what removed its process, detect_s, lost_s and the journal's ``how``.

Rungs per fault (``classify``): the window of a fault runs from its ``fault`` event to its
resolution -- for the kinds the guard answers (nan, flip, update, xid:
``unbroken.core.ettr.RESOLVED_BY``) the guard's first ``resolved`` event of that incident kind,
for the others the first ``replan`` / ``wipeout`` whose members no longer hold the victim, or a
``restart`` (the same rule as the ETTR accounting). The ``ladder`` events in that window whose
``fault`` (the ladder input's kind) answers the fault's kind (``LADDER_FAULTS``) give the rungs
(``rung_from: "ladder"``). A fault with no ladder decision in its window gets its rung from the
per-fault cost's ``rung`` field (``core.ettr.FaultCost.rung``; ``rung_from: "how"``: a replan
-> ``mask``, a wipe-out / restart -> ``restart``). ``removed_by`` is the launcher's
``detected.how`` for the victim's uid (exit, heartbeat, xid, replay, fail-slow, ...), None when its process was never removed.
``all_handled``: every scheduled fault has a ``fault`` event and a ``how`` other than
"unresolved".

Baseline (what a user without an acting guard gets): the same seeds with the guard log-only
(``demo_spec(ft=FTConfig(guard="log"), unguarded=True)``: the demo otherwise refuses
nan/flip/update without ``--guard act``). Kills and hangs are still masked by the runtime; the
NaN is committed, the bit flip is committed silently and the update is never applied. Per run:
finished, ETTR, exactly-once, max param diff and final loss (non-finite numbers as the strings
"nan"/"inf"), or ``failed: <reason>`` for a ``DemoError``. The failure-free reference of a
seed is computed once (the guarded run's cached ``reference-*.pt`` is copied into the baseline's
out dir: same config, same key).

Soak (``--groups 16 --chaos-faults 50 --steps 300``): each run draws K faults of every kind
from ``unbroken.core.faults.soak_faults``; slots fail again and again (a fault hits whichever
process holds its slot then, a replacement included). A log-only baseline cannot finish a soak
(a stall blocks it for good), so the baseline is checkpoint-restart as torchrun's elastic agent
would do it, modelled from the run's own measured start-up and step time (``restart_model``).

Prints ONE JSON object on stdout (progress on stderr); ``--out PATH`` writes a copy.

Usage: ``.venv/bin/python bench/chaos.py [--seeds 3] [--steps 200] [--out docs/bench/chaos.json]``;
the soak: ``bench/chaos.py --seeds 1 --groups 16 --steps 300 --chaos-faults 50
--out docs/bench/soak.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from unbroken.core.ettr import RESOLVED_BY
from unbroken.events import Event

#: chaos fault kind -> the ladder inputs (``core.ladder.FaultKind`` values, the ladder event's
#: ``fault`` field) that answer it: a kill is a death, or a stall the stack vote localised
LADDER_FAULTS = {
    "kill": ("death", "hang"),
    "hang": ("hang",),
    "stall": ("hang",),
    "slow": ("fail-slow",),
    "nan": ("implicit",),
    "flip": ("sdc", "corrupt", "implicit"),
    "xid": ("xid",),
    "update": ("update", "code"),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def finite(x):
    """JSON-safe: non-finite floats become "nan" / "inf" / "-inf" (recursively)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def _t(e: dict) -> float | None:
    t = e.get("t")
    return float(t) if isinstance(t, (int, float)) else None


def classify(events: list[dict], costs: list[dict] | None = None) -> list[dict]:
    """Per ``fault`` event of a demo journal (pure): kind, group, uid, step, the window end,
    the ladder decisions in its window that name its kind, the rungs, ``removed_by`` and, when
    ``costs`` (the report's ``time_lost_per_fault``) are given, its how / detect_s / lost_s."""
    evs = sorted((e for e in events if isinstance(e, dict) and _t(e) is not None), key=_t)
    last_t = _t(evs[-1]) if evs else 0.0
    by_key = {(c.get("kind"), c.get("group"), c.get("step")): c for c in costs or []}
    out = []
    for f in (e for e in evs if e.get("event") == Event.FAULT):
        kind, tf = f.get("kind"), _t(f)
        uid = f.get("uid", f.get("group"))
        incident = RESOLVED_BY.get(kind)

        def ends(e, incident=incident, uid=uid) -> bool:
            if incident is not None:
                return e.get("event") == Event.RESOLVED and e.get("incident") == incident
            if e.get("event") == Event.RESTART:
                return True
            members = e.get("members")
            return e.get("event") in (Event.REPLAN, Event.WIPEOUT) and not (
                isinstance(members, list) and uid in members)

        end = next((e for e in evs if _t(e) >= tf and ends(e)), None)
        t_end = _t(end) if end is not None else last_t
        answers = LADDER_FAULTS.get(kind, ())
        decisions = [e for e in evs if e.get("event") == Event.LADDER and tf <= _t(e) <= t_end
                     and e.get("fault") in answers]
        rungs: list[str] = []
        for d in decisions:
            if d.get("rung") and d["rung"] not in rungs:
                rungs.append(d["rung"])
        cost = by_key.get((kind, f.get("group"), f.get("step")), {})
        how = cost.get("how")
        rung_from = "ladder"
        if not rungs and cost.get("rung"):  # the runtime's own answer (core.ettr's rung)
            rungs, rung_from = [cost["rung"]], "how"
        removed = None
        if kind not in ("update", "nan"):  # these leave every process in place
            det = next((e for e in evs if e.get("event") == Event.DETECTED and _t(e) >= tf
                        and e.get("group") == uid), None)
            removed = det.get("how") if det is not None else None
        out.append({
            "kind": kind, "group": f.get("group"), "uid": uid, "step": f.get("step"),
            "t": tf, "t_end": t_end, "resolved": end is not None,
            "rungs": rungs, "rung_from": rung_from if rungs else None,
            "ladder": [f"{d.get('for')} -> {d.get('rung') or 'no rung'} {d.get('groups', [])} "
                       f"({d.get('mode')})" for d in decisions],
            "removed_by": removed, "how": how, "masked": cost.get("masked"),
            "detect_s": cost.get("detect_s"), "lost_s": cost.get("lost_s"),
        })
    return out


def handled(events: list[dict], costs: list[dict]) -> tuple[bool, list[str]]:
    """Every scheduled fault (the ``start`` event's list) has a ``fault`` event and a ``how``
    other than "unresolved"; the problems, one line each."""
    start = next((e for e in events if e.get("event") == Event.START), {})
    # scheduled (kind, slot, step) -> the step it fired at (a slot's late replacement: later)
    fired = {(e.get("kind"), e.get("group"), e.get("at", e.get("step"))): e.get("step")
             for e in events if e.get("event") == Event.FAULT}
    how = {(c.get("kind"), c.get("group"), c.get("step")): c.get("how") for c in costs}
    problems = []
    for s in start.get("faults", []):
        key = (s.get("kind"), s.get("group"), s.get("step"))
        name = f"{key[0]}:{key[1]}@{key[2]}"
        if key not in fired:
            problems.append(f"{name}: no fault event")
        elif how.get((key[0], key[1], fired[key])) in (None, "unresolved"):
            problems.append(f"{name}: how {how.get((key[0], key[1], fired[key]))!r}")
    return not problems, problems


def _start_s(events: list[dict]) -> float | None:
    """Launch -> the first commit: what a restart of the whole job costs before any step."""
    t0 = next((_t(e) for e in events if e.get("event") == Event.START), None)
    t1 = next((_t(e) for e in events if e.get("event") == Event.COMMIT), None)
    return round(t1 - t0, 2) if t0 is not None and t1 is not None else None


def restart_model(runs: list[dict], ckpt_every: int) -> dict:
    """What checkpoint-restart (torchrun's elastic restart: every fault restarts the job from
    the last checkpoint) would have lost on the same faults, modelled from these runs' own
    measured start-up and step time: per fault one start-up plus half a checkpoint interval of
    recomputed steps. Not a run: a soak of restarts is what the bench exists to avoid."""
    ok = [r for r in runs if "failed" not in r and r.get("start_s") is not None]
    if not ok:
        return {}
    per = [r["start_s"] + ckpt_every / 2 * r["step_s"] for r in ok]
    lost = [p * len(r["faults"]) for p, r in zip(per, ok)]
    ettr = [r["train_s"] / (r["train_s"] + x) for r, x in zip(ok, lost)]
    ours = [sum(f["lost_s"] or 0.0 for f in r["faults"]) for r in ok]
    return {"how": "modelled: per fault, this run's launch->first-commit time plus "
                   f"{ckpt_every}/2 steps recomputed at its step time",
            "ckpt_every": ckpt_every, "median_lost_per_fault_s": _med(per),
            "median_lost_s": _med(lost), "median_ettr": _med(ettr),
            "ours_median_lost_s": _med(ours),
            "lost_ratio_restart_over_ours": _med([x / o for x, o in zip(lost, ours) if o > 0])}


def _journal(out: Path) -> list[dict]:
    p = out / "journal.jsonl"
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def _tail(events: list[dict], n: int = 12) -> list[str]:
    """The last ``n`` non-commit events, compact (for a failed run's report)."""
    keep = [e for e in events if e.get("event") not in (Event.COMMIT, Event.SDC_CHECK)]
    return [json.dumps({k: v for k, v in e.items() if k not in ("t",)})[:300]
            for e in keep[-n:]]


def _top_step(events: list[dict]) -> int:
    return max((e["step"] for e in events if e.get("event") == Event.COMMIT
                and isinstance(e.get("step"), int)), default=-1)


def _run(req, seed: int, out: Path) -> tuple[dict | None, dict]:
    """``run_demo(req)``: (report, {}) or, when the run could not finish, (None, a record of
    where it stopped)."""
    from unbroken.demo import DemoError, DemoExit, run_demo

    t0 = time.monotonic()
    try:
        return run_demo(req), {}
    except (DemoError, DemoExit) as exc:
        events = _journal(out)
        return None, {"seed": seed, "failed": f"failed: {exc}"[:2000],
                      "wall_s": round(time.monotonic() - t0, 1), "top_step": _top_step(events),
                      "journal_tail": _tail(events)}


def guarded(seed: int, steps: int, out: Path, groups: int = 4, count: int | None = None) -> dict:
    from unbroken.core.faults import format_faults
    from unbroken.demo import demo_spec
    from unbroken.supervise.spec import FTConfig

    req = demo_spec(chaos=seed, steps=steps, ft=FTConfig(guard="act"), out=str(out),
                    groups=groups, chaos_faults=count)
    spec = format_faults(req.fault_list())
    rep, failed = _run(req, seed, out)
    if rep is None:
        return {**failed, "fault_spec": spec}
    events = _journal(out)
    costs = rep["time_lost_per_fault"]
    ok, problems = handled(events, costs)
    faults = [{k: v for k, v in x.items() if k not in ("t", "t_end", "uid")}
              for x in classify(events, costs)]
    return {"seed": seed, "fault_spec": spec, "ettr": rep["ettr"],
            "exactly_once": rep["exactly_once"], "max_abs_param_diff": rep["max_abs_param_diff"],
            "final_loss": rep["final_loss"], "step_s": rep["step_s"], "train_s": rep["train_s"],
            "restarts": rep["restarts"], "start_s": _start_s(events),
            # a process removed that no scheduled fault hit: a false hang (or a real failure)
            "faults_external": rep.get("faults_external", 0),
            "faults_masked": rep["faults_masked"], "wall_s": round(rep["wall_s"], 2),
            "all_handled": ok, "unhandled": problems, "faults": faults}


def baseline(seed: int, steps: int, out: Path, ref_from: Path | None) -> dict:
    from unbroken.demo import demo_spec
    from unbroken.supervise.spec import FTConfig

    req = demo_spec(chaos=seed, steps=steps, ft=FTConfig(guard="log"), unguarded=True,
                    out=str(out))
    out.mkdir(parents=True, exist_ok=True)
    if ref_from is not None:  # same seed and config: the same cached failure-free reference
        for ref in ref_from.glob("reference-*.pt"):
            shutil.copy(ref, out / ref.name)
    rep, failed = _run(req, seed, out)
    if rep is None:
        return {**failed, "finished": False}
    diff = rep["max_abs_param_diff"]
    return {"seed": seed, "finished": rep["steps"] >= (rep["steps_planned"] or steps),
            "steps": rep["steps"], "ettr": rep["ettr"], "exactly_once": rep["exactly_once"],
            "max_abs_param_diff": diff, "final_loss": rep["final_loss"],
            "params_finite": diff is not None and math.isfinite(diff), "step_s": rep["step_s"],
            "train_s": rep["train_s"],
            "wall_s": round(rep["wall_s"], 2),
            "how": {f"{c['kind']}@{c['step']}": c["how"] for c in rep["time_lost_per_fault"]}}


def _med(xs: list) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return round(statistics.median(xs), 4) if xs else None


def aggregate(runs: list[dict]) -> dict:
    ok = [r for r in runs if "failed" not in r]
    kinds: dict[str, dict] = {}
    for r in ok:
        for f in r["faults"]:
            k = kinds.setdefault(f["kind"], {"detect": [], "lost": [], "rungs": set(),
                                             "removed_by": set(), "how": []})
            k["detect"].append(f["detect_s"])
            k["lost"].append(f["lost_s"])
            k["rungs"].update(f["rungs"])
            if f["removed_by"] is not None:
                k["removed_by"].add(f["removed_by"])
            k["how"].append(f["how"])
    per_kind = {kind: {"n": len(k["lost"]), "median_detect_s": _med(k["detect"]),
                       "median_lost_s": _med(k["lost"]), "rungs": sorted(k["rungs"]),
                       "removed_by": sorted(k["removed_by"]), "how": k["how"]}
                for kind, k in sorted(kinds.items())}
    diffs = [r["max_abs_param_diff"] for r in ok]
    return {"runs": len(runs), "failed": len(runs) - len(ok),
            "median_ettr": _med([r["ettr"] for r in ok]),
            "min_ettr": min((r["ettr"] for r in ok), default=None),
            "all_exactly_once": bool(ok) and all(r["exactly_once"] for r in ok),
            "all_handled": bool(ok) and len(ok) == len(runs) and all(r["all_handled"]
                                                                      for r in ok),
            "max_abs_param_diff": max(diffs, key=lambda d: (d != d, d)) if diffs else None,
            "median_wall_s": _med([r["wall_s"] for r in ok]),
            "faults_external": sum(r.get("faults_external", 0) for r in ok),
            "median_train_s": _med([r["train_s"] for r in ok]),
            "per_kind": per_kind}


def compare(act: list[dict], base: list[dict]) -> dict:
    """Per seed and overall: the acting guard's max param diff against the baseline's."""
    def one(a, b) -> dict:
        da = a.get("max_abs_param_diff") if "failed" not in a else None
        db = b.get("max_abs_param_diff") if "failed" not in b else None
        out = {"act": da, "baseline": db}
        if "failed" in a or "failed" in b:
            out["note"] = "act failed" if "failed" in a else "baseline failed"
        elif da is None or db is None:
            out["note"] = "no diff"
        elif math.isfinite(da) and math.isfinite(db):
            out["baseline_over_act"] = db / da if da > 0 else ("inf" if db > 0 else 1.0)
        else:
            out["note"] = " and ".join(f"{n} is {'nan' if d != d else 'inf'}"
                                       for n, d in (("act", da), ("baseline", db))
                                       if not math.isfinite(d))
        return out

    seeds = {r["seed"]: r for r in base}
    per = {a["seed"]: one(a, seeds[a["seed"]]) for a in act if a["seed"] in seeds}
    return {"per_seed": per,
            "baseline_nonfinite_params": sum(1 for b in base if "failed" not in b
                                             and not b.get("params_finite")),
            "baseline_failed": sum(1 for b in base if "failed" in b),
            "baseline_finished": sum(1 for b in base if b.get("finished"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="chaos seeds 0..SEEDS-1 (default 3)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--chaos-faults", type=int, default=None, metavar="K",
                    help="a soak: K faults per run, slots failing again (core.faults."
                         "soak_faults); the log-only baseline is replaced by a modelled "
                         "checkpoint-restart one")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--workdir", help="keep every run's out dir here (default: a temp dir)")
    ap.add_argument("--out", help="also write the JSON object to this file")
    a = ap.parse_args()

    t0 = time.monotonic()
    tmp = None
    if a.workdir:
        root = Path(a.workdir)
        root.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="unbroken-chaos-")
        root = Path(tmp.name)
    act, base = [], []
    try:
        for s in range(a.seeds):
            log(f"seed {s}: guard act")
            r = guarded(s, a.steps, root / f"act-{s}", a.groups, a.chaos_faults)
            act.append(r)
            if "failed" in r:
                log(f"  {r['failed'].splitlines()[0]}")
            else:
                log(f"  {r['fault_spec']}: ettr {r['ettr']:.3f}, exactly-once "
                    f"{r['exactly_once']}, diff {r['max_abs_param_diff']:.3g}, handled "
                    f"{r['all_handled']}, wall {r['wall_s']:.1f} s")
                for f in r["faults"]:
                    log(f"    {f['kind']:6s} @{f['step']:3d}: {','.join(f['rungs']) or '-':14s}"
                        f" removed_by {f['removed_by']}, lost {f['lost_s']:.2f} s, {f['how']}")
            if a.skip_baseline or a.chaos_faults is not None:
                continue
            log(f"seed {s}: baseline (guard log-only)")
            b = baseline(s, a.steps, root / f"log-{s}",
                         root / f"act-{s}" if "failed" not in r else None)
            base.append(b)
            log(f"  {b['failed'].splitlines()[0]}" if "failed" in b else
                f"  finished {b['finished']}, ettr {b['ettr']:.3f}, exactly-once "
                f"{b['exactly_once']}, diff {b['max_abs_param_diff']}, loss {b['final_loss']}")
    finally:
        if tmp is not None:
            tmp.cleanup()

    out = {"bench": "chaos" if a.chaos_faults is None else "soak", "groups": a.groups,
           "redundancy": 2, "model": "gpt", "steps": a.steps, "chaos_faults": a.chaos_faults,
           "seeds": a.seeds, "guard": "act", "cpus": os.cpu_count(),
           "python": platform.python_version(),
           "summary": aggregate(act), "runs": act}
    if a.chaos_faults is not None:
        out["baseline"] = restart_model(act, ckpt_every=10)
    elif not a.skip_baseline:
        out["baseline"] = {
            "guard": "log (unguarded: nan/flip/update run without an acting guard)",
            "median_ettr": _med([b["ettr"] for b in base if "failed" not in b]),
            "median_train_s": _med([b["train_s"] for b in base if "failed" not in b]),
            "all_finished": all(b.get("finished") for b in base),
            "all_exactly_once": all(b.get("exactly_once") for b in base),
            "runs": base}
        out["comparison"] = compare(act, base)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    text = json.dumps(finite(out), allow_nan=False)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
