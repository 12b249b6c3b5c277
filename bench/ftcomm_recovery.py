"""Recovery time of unbroken.runtime.ftcomm with 4 local gloo workers (CPU). Prints ONE JSON object.

For each scenario a fresh 4-worker LocalCluster all-reduces 1024 floats in a loop (5 ms simulated
compute per step); once every worker has done 10 steps one worker is faulted:

* ``kill``          SIGKILL uid 2; survivors find out by gloo errors + stale heartbeat (no help);
* ``kill_notified`` SIGKILL uid 2; the coordinator sees the exit and posts a death notice;
* ``hang``          SIGSTOP uid 1; survivors find out by stale heartbeat.

Metric: signal -> the *last* survivor's first completed, correct all-reduce in generation 1
(wall clock, same machine). Median / min / max over ``--repeats`` runs, plus medians of the
per-survivor journal timings (detect, rendezvous, pg init). heartbeat 0.1 s, staleness 1.0 s.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from unbroken.runtime.ftcomm_worker import LocalCluster

N = 4


def one(kind: str) -> dict:
    victim = 1 if kind == "hang" else 2
    survivors = [u for u in range(N) if u != victim]
    with LocalCluster(N) as c:
        for u in range(N):
            c.wait_key(f"result/{u}/10", 60)
        if kind == "hang":
            t0 = c.hang(victim)
        else:
            t0 = c.kill(victim, notify=(kind == "kill_notified"))
        firsts = {u: c.wait_key(f"first/{u}/1", 30, alive=survivors) for u in survivors}
        want = float(sum(u + 1 for u in survivors))
        correct = all(r["value"] == want and r["members"] == survivors for r in firsts.values())
        done = c.stop(survivors)
    det, rdzv, pg = [], [], []
    for u in survivors:
        ab = next(e for e in done[u]["journal"] if e["event"] == "abort")
        rf = next(e for e in done[u]["journal"] if e["event"] == "reform")
        det.append(ab["t"] - t0)
        rdzv.append(rf["rendezvous_s"])
        pg.append(rf["pg_init_s"])
    return {"to_next_allreduce_s": max(r["t"] for r in firsts.values()) - t0,
            "detect_s": statistics.median(det), "rendezvous_s": statistics.median(rdzv),
            "pg_init_s": statistics.median(pg), "correct": correct}


def summarize(runs: list[dict]) -> dict:
    xs = [r["to_next_allreduce_s"] for r in runs]
    return {
        "median_s": round(statistics.median(xs), 4),
        "min_s": round(min(xs), 4),
        "max_s": round(max(xs), 4),
        "detect_median_s": round(statistics.median(r["detect_s"] for r in runs), 4),
        "rendezvous_median_s": round(statistics.median(r["rendezvous_s"] for r in runs), 4),
        "pg_init_median_s": round(statistics.median(r["pg_init_s"] for r in runs), 4),
        "all_correct": all(r["correct"] for r in runs),
        "repeats": len(runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    t0 = time.time()
    out = {"bench": "ftcomm_recovery", "workers": N, "backend": "gloo", "torch": torch.__version__,
           "heartbeat_s": 0.1, "staleness_s": 1.0, "numel": 1024, "machine": platform.machine()}
    for kind in ("kill", "kill_notified", "hang"):
        out[kind] = summarize([one(kind) for _ in range(a.repeats)])
    out["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
