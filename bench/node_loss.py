"""Node loss under node agents: how fast a lost node is found and masked.

Prints ONE JSON object on stdout (progress on stderr). ``unbroken run``'s supervisor in this
process, ``--trainer mlp``, 6 groups (r = 2) on 3 local node agents (``--local-nodes 3``), one
fault per run at step 10 of ``--steps``, ``--repeats`` runs per case, median / min / max:

* ``kill``: ``node:1@10``, the agent SIGKILLed with its process group (its workers follow);
* ``cut``: ``cut:1@10``, the agent SIGSTOPped, its workers running on (found by silence,
  ``--node-staleness``);
* ``group_kill`` (the baseline: what the supervisor already does for one process, no agents):
  ``kill:1@10`` under the plain ``StackedCluster``.

Metrics from the merged journal, all relative to the fault event's wall time: ``node_lost_s``
(the coordinator's ``node_lost``), ``detected_s`` (the supervisor's last ``detected`` of the
fault's members), ``masked_s`` (the first ``replan`` whose members exclude them, i.e. the
survivors re-formed without them); plus ``exactly_once`` and ``restarts`` of each run.

Usage: ``.venv/bin/python bench/node_loss.py [--repeats 3] [--steps 200]
[--node-staleness 1.0]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from unbroken.events import Event
from unbroken.supervise import JobSpec, Supervisor
from unbroken.supervise.spec import FTConfig

CASES = {"kill": ("node:1@10", 3), "cut": ("cut:1@10", 3), "group_kill": ("kill:1@10", 0)}


def one(case: str, steps: int, staleness: float, out: Path) -> dict:
    faults, nodes = CASES[case]
    spec = JobSpec(trainer="mlp", groups=6, steps=steps, faults=faults, local_nodes=nodes,
                   out=str(out), timeout=600, ft=FTConfig(node_staleness=staleness))
    sup = Supervisor(spec)
    res = sup.run()
    ev = sup.events
    hit = [e for e in ev if e["event"] == Event.FAULT]
    t0, uids = hit[0]["t"], {e.get("uid", e["group"]) for e in hit}
    lost = [e["t"] - t0 for e in ev if e["event"] == Event.NODE_LOST]
    det = [e["t"] - t0 for e in ev if e["event"] == Event.DETECTED and e["group"] in uids]
    masked = [e["t"] - t0 for e in ev if e["event"] == Event.REPLAN
              and not uids & set(e.get("members", []))]
    return {"node_lost_s": lost[0] if lost else None, "detected_s": max(det) if det else None,
            "masked_s": min(masked) if masked else None,
            "exactly_once": res.report.get("exactly_once"),
            "restarts": res.report.get("restarts"), "ok": res.ok}


def summary(xs: list) -> dict | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
            "max": round(max(xs), 4), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--node-staleness", type=float, default=1.0)
    a = ap.parse_args()
    out: dict = {"groups": 6, "redundancy": 2, "nodes": 3, "steps": a.steps,
                 "node_staleness_s": a.node_staleness, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            runs = []
            for i in range(a.repeats):
                print(f"{case} {i + 1}/{a.repeats}", file=sys.stderr, flush=True)
                runs.append(one(case, a.steps, a.node_staleness, Path(tmp) / f"{case}-{i}"))
            out["cases"][case] = {
                **{k: summary([r[k] for r in runs])
                   for k in ("node_lost_s", "detected_s", "masked_s")},
                "all_exactly_once": all(r["exactly_once"] for r in runs),
                "restarts": sum(r["restarts"] or 0 for r in runs),
                "all_ok": all(r["ok"] for r in runs)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
