"""Cost of one simulated step against the cluster size N and the redundancy r (issue 13).

The simulator must answer at N = 100,000 as it does at N = 600. This times SPARe runs over
N = 1,000 .. 100,000 and r = 8, 16, 27, each for at most ``--budget`` seconds, and reports the
median over ``--repeats`` (seeds) of the CPU time per committed step and per masked failure
(process time: the machine is shared, so wall time measures the neighbours too; the set-up,
layout, first draws and checkpoint interval, is timed on its own and taken off), in two regimes:

* ``fixed_allreduce``: T_a = 6 s at every N, so a step sees the same number of failures at
  every N (the system MTBF is fixed at 5 min). The cost per step isolates what N itself costs.
* ``paper_allreduce``: T_a = N / 100 s, the paper's scaling. A step then lasts ~N/100 s and
  sees ~N/30,000 failures, so the cost per *failure* is the comparable number.

``exponent_*`` is the least-squares slope of log(cost) against log(N) per r: 1 is linear.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from unbroken.core import placement, theory
from unbroken.core.scenario import Scenario
from unbroken.sim import engine
from unbroken.sim.engine import simulate


def one(n: int, r: int, t_allreduce: float | None, steps: int, budget: float, seed: int):
    """CPU seconds of a run of ``steps`` steps (budget-capped) minus its set-up (the layout,
    the first draws, the checkpoint interval: building the run without stepping it)."""
    sc = Scenario(groups=n, gpus=max(600_000, n), steps=steps, t_allreduce=t_allreduce)
    t0 = time.process_time()
    engine._Run(sc, "spare", r, seed, theory.ckpt_every(sc, "spare", r))
    setup = time.process_time() - t0
    t0 = time.process_time()
    res = simulate(sc, "spare", r, seed=seed, deadline=time.monotonic() + budget)
    return max(time.process_time() - t0 - setup, 0.0), res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--groups", type=int, nargs="+", default=[1000, 3000, 10_000, 30_000,
                                                                100_000])
    ap.add_argument("--redundancy", type=int, nargs="+", default=[8, 16, 27])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--budget", type=float, default=4.0, help="seconds per run at most")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    out: dict = {"steps_asked": a.steps, "budget_s_per_run": a.budget, "repeats": a.repeats,
                 "fixed_allreduce": [], "paper_allreduce": []}
    for regime, t_a in (("fixed_allreduce", 6.0), ("paper_allreduce", None)):
        for r in a.redundancy:
            for n in a.groups:
                if placement.max_redundancy(n) < r:
                    continue
                per_step, per_fail, fails_per_step = [], [], []
                for rep in range(a.repeats):
                    cpu, res = one(n, r, t_a, a.steps, a.budget, seed=rep)
                    attempts = max(1, res.committed_steps)
                    per_step.append(cpu / attempts)
                    if res.masked_failures:
                        per_fail.append(cpu / res.masked_failures)
                    fails_per_step.append(res.masked_failures / attempts)
                out[regime].append({
                    "groups": n, "redundancy": r,
                    "ms_per_step": 1e3 * float(np.median(per_step)),
                    "ms_per_failure": 1e3 * float(np.median(per_fail)) if per_fail else None,
                    "failures_per_step": float(np.median(fails_per_step)),
                })
        for r in a.redundancy:
            rows = [x for x in out[regime] if x["redundancy"] == r]
            for key in ("ms_per_step", "ms_per_failure"):
                pts = [(x["groups"], x[key]) for x in rows if x[key]]
                if len(pts) >= 2:
                    lx, ly = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
                    out.setdefault(f"exponent_{key}", {}).setdefault(regime, {})[str(r)] = \
                        round(float(np.polyfit(lx, ly, 1)[0]), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
