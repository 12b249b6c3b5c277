"""How the cost of recovery grows with the number of groups N. Prints ONE JSON object.

Issue 10 asks for recovery whose cost is flat in N. For each N in ``--sizes`` (default 4, 8, 16,
32) and each of ``--repeats`` runs, one fresh ``StackedCluster`` (N real worker processes plus
one warm spare, r = 2, the default MLP so that 33 processes fit two cores; heartbeat 0.1 s,
staleness 0.3 s, the default) trains ``STEPS`` steps through three faults:

* **kill -> next commit**: uid 1 SIGKILLs itself at step ``KILL_AT`` after computing its
  gradient (``--die-at``); the launcher sees the exit and posts the death notice, as the
  supervisor does. From the ``killed/1`` timestamp to the last survivor's commit of that step.
* **spare admission**: the launcher then sends the spare to slot 1; from that order to the
  joiner's ``joined`` event (planned re-form with the joiner, the settle, the state copy from
  one old member, the fresh plan). The survivors' ``admit`` event time is reported too.
* **hang -> next commit**: uid 3 SIGSTOPs itself at step ``HANG_AT`` (``--stop-at``); from the
  ``stopped/3`` timestamp to the last survivor's commit of that step (found by heartbeat
  staleness; nobody posts a notice).

Also the failure-free step time (median commit interval of one group before the kill), so the
recovery numbers can be read against the step: on two cores N processes share the CPU, so the
step itself slows with N, and so does anything CPU-bound; ``*_in_steps`` divides it out. Medians over repeats per N. Nothing else should
run on the machine: 2 cores carry up to 33 processes at N = 32.

Pairs of gloo ranks connect on first use (``TORCH_GLOO_LAZY_INIT``, ftcomm's default). With
``--eager-too`` every run is repeated, interleaved, with gloo's full mesh
(``TORCH_GLOO_LAZY_INIT=0``: torch's default, what a re-form cost before), and the ratios
lazy / eager are reported per N.

Usage: ``.venv/bin/python bench/recovery_scaling.py [--sizes 4,8,16,32] [--repeats 3]
[--eager-too]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

from unbroken.runtime.config import TrainConfig
from unbroken.runtime.ftcomm import declare_dead
from unbroken.supervise.local import StackedCluster

R = 2
KILL_AT, HANG_AT, STEPS = 10, 60, 90
VICTIM, HUNG = 1, 3
HEARTBEAT, STALENESS = 0.1, 0.3


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def first(events: list[dict], **match) -> dict | None:
    return next((e for e in events if all(e.get(k) == v for k, v in match.items())), None)


def one(n: int) -> dict:
    cfg = TrainConfig(groups=n, redundancy=R, steps=STEPS, seed=5)
    spare = n
    with tempfile.TemporaryDirectory() as d:
        with StackedCluster(cfg, d, die_at={VICTIM: KILL_AT}, stop_at={HUNG: HANG_AT}, spares=1,
                            heartbeat=HEARTBEAT, staleness=STALENESS) as c:
            alive = [u for u in range(n) if u != VICTIM]
            t_kill = float(c.wait_key(f"killed/{VICTIM}", 300, alive=alive))
            c.procs[VICTIM].wait(timeout=30)
            declare_dead(c.store, VICTIM)
            t_assign = time.time()
            c.assign(spare, VICTIM)
            t_hang = float(c.wait_key(f"stopped/{HUNG}", 300, alive=alive + [spare]))
            finishers = [u for u in alive + [spare] if u != HUNG]
            for u in finishers:
                c.wait_key(f"done/{u}", 300, alive=finishers)
            journals = {u: c.journal(u) for u in finishers}
    survivors = [u for u in range(n) if u not in (VICTIM, HUNG)]

    def commit_t(u: int, step: int) -> float:
        return first(journals[u], event="commit", step=step)["t"]

    ts = [e["t"] for e in journals[0] if e["event"] == "commit" and e["step"] < KILL_AT]
    joined = first(journals[spare], event="joined")
    admits = [first(journals[u], event="admit") for u in survivors]
    hang_commit = [first(journals[u], event="commit", step=HANG_AT) for u in finishers]
    return {
        "kill_to_commit_s": max(commit_t(u, KILL_AT) for u in survivors) - t_kill,
        "admit_s": joined["t"] - t_assign,
        "admit_event_s": statistics.median(a["t"] for a in admits) - t_assign,
        "hang_to_commit_s": max(e["t"] for e in hang_commit) - t_hang,
        "hang_commit_members": sorted(hang_commit[0]["members"]),
        "step_s": statistics.median(b - a for a, b in zip(ts, ts[1:])),
    }


KEYS = ("kill_to_commit_s", "admit_s", "admit_event_s", "hang_to_commit_s", "step_s")


def one_with(n: int, lazy: str) -> dict:
    """``one(n)`` with gloo pairs connected lazily ("1") or as a full mesh ("0")."""
    os.environ["TORCH_GLOO_LAZY_INIT"] = lazy  # the workers take the environment at spawn
    try:
        return one(n)
    finally:
        del os.environ["TORCH_GLOO_LAZY_INIT"]


def summarise(runs: list[dict]) -> dict:
    return {**{f"median_{k}": round(statistics.median(r[k] for r in runs), 4) for k in KEYS},
            # on two cores the step itself slows with N (N processes share them): recovery
            # in units of the step separates the protocol from the box
            **{f"median_{k[:-2]}_in_steps": round(statistics.median(
                r[k] / r["step_s"] for r in runs), 2) for k in KEYS[:-1]},
            "runs": [{k: round(r[k], 4) for k in KEYS} for r in runs],
            "hung_group_dropped": all(HUNG not in r["hang_commit_members"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="4,8,16,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eager-too", action="store_true",
                    help="also every run with gloo's full mesh, interleaved (the baseline)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    modes = ["1", "0"] if a.eager_too else ["1"]
    t0 = time.time()
    out: dict = {}
    eager: dict = {}
    for n in sizes:
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for i in range(a.repeats):
            for m in modes if i % 2 == 0 else modes[::-1]:  # alternate which goes first
                r = one_with(n, m)
                log(f"N={n} rep {i} {'lazy' if m == '1' else 'eager'}: "
                    + ", ".join(f"{k} {r[k] * 1e3:.0f} ms" for k in KEYS))
                runs[m].append(r)
        out[str(n)] = summarise(runs["1"])
        if a.eager_too:
            eager[str(n)] = summarise(runs["0"])
    lo, hi = str(sizes[0]), str(sizes[-1])
    extra = {} if not a.eager_too else {
        "eager_full_mesh_by_n": eager,
        "lazy_over_eager": {n: {k: round(out[n][f"median_{k}"] / eager[n][f"median_{k}"], 3)
                                for k in KEYS} for n in out}}
    print(json.dumps({
        "bench": "recovery_scaling", "redundancy": R, "model": "mlp (TrainConfig default)",
        "kill_at": KILL_AT, "hang_at": HANG_AT, "steps": STEPS, "heartbeat_s": HEARTBEAT,
        "staleness_s": STALENESS, "repeats": a.repeats, "sizes": sizes,
        "gloo_pairs": "lazy (TORCH_GLOO_LAZY_INIT=1)", "by_n": out, **extra,
        "growth_smallest_to_largest": {k: round(out[hi][f"median_{k}"]
                                                / max(out[lo][f"median_{k}"], 1e-9), 3)
                                       for k in KEYS},
        "torch": torch.__version__, "python": platform.python_version(), "cpus": 2,
        "wall_s": round(time.time() - t0, 1),
    }))


if __name__ == "__main__":
    main()
