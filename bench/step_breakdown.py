"""What each part of the failure-free step costs, against plain data parallelism. Prints ONE JSON.

The step time ratio of ``train_bars.py`` says *how much* slower the stacked step is; this says
*where* the time goes. Four processes share two cores here, so the step time follows the CPU
the processes burn: a millisecond of CPU per step in each of four workers is about two
milliseconds of step time. So the breakdown is CPU time of each worker's training thread, per
step, by part of the step, from ``cProfile`` timed by ``time.thread_time`` (the thread's own
CPU clock: waiting in a collective costs nothing, spinning does).

* stacked: real ``stacked_worker`` processes (``StackedCluster``, GPT of ``train_bars``),
  ``UNBROKEN_PROFILE`` set, so each worker profiles ``StackedRunner.run``;
* plain DP: this file re-executed as ``--plain-worker``: own shard's gradient, one blocking
  ``dist.all_reduce`` of the flat gradient, ``apply`` (as ``train_bars.py``'s plain worker).

Parts (cumulative CPU of these functions, per step, median over the 4 workers): ``gradient``
(the trainer's ``grad``), ``optimizer`` (``apply``), ``all-reduce`` (``FTComm.allreduce`` /
``dist.all_reduce``), ``pack`` (the step buffer), ``step check`` (the in-band check),
``commit bookkeeping`` (``_commit`` less the optimizer: the ledger line, the control values),
``other`` (the rest of the loop).

Usage: ``.venv/bin/python bench/step_breakdown.py [--steps 200]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_bars import HEARTBEAT, N, STEP_STALENESS, gpt_config, log, plain_rank_setup, plain_ranks  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

#: part -> (file suffix, function name) of the function whose cumulative time it is
PARTS = {
    "gradient": [("runtime/gpt.py", "grad")],
    "optimizer": [("runtime/trainer.py", "apply")],
    "all-reduce": [("runtime/ftcomm_ops.py", "allreduce"), ("distributed_c10d.py", "all_reduce")],
    "pack": [("runtime/stacked.py", "_pack")],
    "step check": [("runtime/incidents.py", "_step_check")],
}
LOOPS = [("runtime/stacked.py", "run"), ("step_breakdown.py", "loop")]
COMMIT = ("runtime/stacked.py", "_commit")


def plain_worker(a: argparse.Namespace) -> None:
    import cProfile

    import torch.distributed as dist

    cfg, tr = plain_rank_setup(a)

    def loop() -> None:
        for k in range(cfg.steps):
            g = tr.grad(k, a.rank)
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            tr.apply(g)

    prof = cProfile.Profile(time.thread_time)
    prof.runcall(loop)
    prof.dump_stats(os.path.join(a.out, f"group-{a.rank}.prof"))
    dist.barrier()
    os._exit(0)


def _cum(stats: dict, suffix: str, name: str) -> float:
    return sum(v[3] for (f, _l, fn), v in stats.items() if f.endswith(suffix) and fn == name)


def breakdown(path: str, steps: int) -> dict:
    stats = pstats.Stats(path).stats
    per = {p: sum(_cum(stats, *k) for k in keys) for p, keys in PARTS.items()}
    total = max(_cum(stats, *k) for k in LOOPS)
    commit = _cum(stats, *COMMIT)
    if commit:
        per["commit bookkeeping"] = max(0.0, commit - per["optimizer"])
    per["other"] = total - sum(per.values())
    out = {p: 1e3 * v / steps for p, v in per.items()}
    out["total"] = 1e3 * total / steps
    return out


def run_stacked(cfg: TrainConfig) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        os.environ["UNBROKEN_PROFILE"] = d
        try:
            with StackedCluster(cfg, d, heartbeat=HEARTBEAT, staleness=STEP_STALENESS) as c:
                for u in range(N):
                    c.wait_key(f"done/{u}", 180)
                for u in range(N):
                    assert c.procs[u].wait(timeout=30) == 0
        finally:
            del os.environ["UNBROKEN_PROFILE"]
        return [breakdown(os.path.join(d, f"group-{u}.prof"), cfg.steps) for u in range(N)]


def run_plain(cfg: TrainConfig) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        plain_ranks(cfg, __file__, d, timeout=180)
        return [breakdown(os.path.join(d, f"group-{r}.prof"), cfg.steps) for r in range(N)]


def median_parts(groups: list[dict]) -> dict:
    return {p: round(statistics.median(g[p] for g in groups), 3) for p in groups[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.plain_worker:
        plain_worker(a)
        return
    cfg = gpt_config(a.steps)
    log("plain DP ...")
    plain = median_parts(run_plain(cfg))
    log("stacked ...")
    stacked = median_parts(run_stacked(cfg))
    extra = {p: round(stacked.get(p, 0.0) - plain.get(p, 0.0), 3) for p in stacked}
    print(json.dumps({
        "bench": "step_breakdown", "groups": N, "steps": a.steps, "model": "gpt (train_bars)",
        "unit": "ms of the training thread's CPU per step, median over the 4 workers",
        "plain": plain, "stacked": stacked, "stacked_minus_plain": extra,
        "cpu_ratio": round(stacked["total"] / plain["total"], 4),
        "torch": torch.__version__, "python": platform.python_version(),
        "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
