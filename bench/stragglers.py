"""Stragglers on this machine (issue 11): the GPT demo preset under straggler traces and one real
cause, in ``sync`` (today's synchronous step). Prints ONE JSON object; progress goes to stderr.

Each case is the product as a user runs it (``unbroken run --trainer gpt --faults none``: the
Supervisor, 4 worker processes of 1 torch thread each, no spare, the guard log-only), ``--steps``
steps:

* ``none``: no stragglers;
* ``persistent:1@2``: group 1 sleeps 1x its own measured gradient compute after each gradient;
* ``bursty:0``: AR(1) jitter on every group plus bursts (1.5-3x) on random groups;
* ``rotating:0.3``: each step one random group is 2x slower with probability 0.3;
* ``cpu_hog``: no trace; a real cause instead. ``--hogs`` (5) ``python3 -c 'while True: pass'``
  processes and group 1's worker (found by its command line, ``--uid 1`` under this run's
  journal directory) are pinned with ``os.sched_setaffinity`` to the machine's last core, and
  the other groups to the remaining cores, as soon as each worker exists (during its start-up,
  before step 0). Why pin everyone and why 5: on 2 cores the 4 groups already share, so one
  equal-priority hog next to group 1 with the others left free made no straggler (measured:
  the scheduler moved a group onto the hog's core and every group got ~1/3 of a core, own
  times within 7 % of each other); with the others on the other core (1/3 of it each), group 1
  gets 1/(hogs+1) of its core: 1/6, half of its peers' share, a 2x straggler. On a machine
  with more cores the peers get more and the ratio is larger; the run records what it pinned.
* ``pinned``: the control of ``cpu_hog``: the same pinning, no busy loop (on 2 cores, three
  groups on one core is itself slower than four groups free on two).

Reported per case (median over ``--repeats`` runs, each run's own numbers in ``runs``):
``wall_s`` (start-up included), ``step_s`` (the ETTR accounting's median failure-free step, i.e.
commit to commit), ``straggler_frequency`` (share of steps with a group's own time over 1.2x the
fastest's), ``own_ratio`` (the slowest group's median own time over the fastest's: the
trace's or the hog's effect, which other load on the machine moves far less than ``step_s``),
``tta_s`` / ``tta_train_s`` to the target loss (from the run's start / from step 0's
commit), and per group the median own time (``own_ms``) and CPU availability (``cpu``).

The target loss is the lowest loss the straggler-free run commits in its first ``0.8 x steps``
steps (a per-step loss is one global batch's and noisy: the loss of one step is reached much
earlier by chance); a trace
changes timing only (the committed losses are the same bit for bit), so every case reaches it
at the same step and TTA differences are wall-time differences.

``sampling_cost_us``: what the per-step resource sampling adds to a step (two ``thread_time``
calls and one ``pread`` + parse of ``/proc/self/io``), timed directly over 20,000 samples.

Usage: ``.venv/bin/python bench/stragglers.py [--steps 120] [--repeats 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CASES = ("none", "persistent:1@2", "bursty:0", "rotating:0.3", "pinned", "cpu_hog")
HOG_GROUP = 1


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _find_worker(uid: int, journal_dir: str) -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            cmd = _cmdline(d.name)
            if f"--uid {uid} " in cmd and journal_dir in cmd and "--standby" not in cmd:
                return int(d.name)
    return None


class Hog:
    """``n`` busy loops pinned to ``core``, and the job's workers pinned once they exist: group
    ``uid`` to ``core`` with the loops, every other group to the remaining cores."""

    def __init__(self, journal_dir: str, uid: int, groups: int, core: int, n: int) -> None:
        self.journal_dir, self.uid, self.groups, self.core = journal_dir, uid, groups, core
        self.others = (set(os.sched_getaffinity(0)) - {core}) or {core}
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(n)]
        for p in self.procs:
            os.sched_setaffinity(p.pid, {core})
        self.pinned: dict[int, int] = {}  # uid -> pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pin, daemon=True)
        self._thread.start()

    def _pin(self) -> None:
        while not self._stop.is_set() and len(self.pinned) < self.groups:
            for u in range(self.groups):
                pid = None if u in self.pinned else _find_worker(u, self.journal_dir)
                if pid is not None:
                    try:
                        os.sched_setaffinity(pid, {self.core} if u == self.uid else self.others)
                        self.pinned[u] = pid
                    except OSError:
                        pass
            self._stop.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for p in self.procs:
            p.kill()
            p.wait(timeout=10)


def run_case(case: str, steps: int, seed: int, hogs: int, sync: str = "sync",
             selector: str | None = None) -> dict:
    """One run of ``case`` in sync mode ``sync``: its report, journal events and (for the hog)
    what was pinned."""
    from unbroken.supervise import FTConfig, JobSpec, Supervisor

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "run")
        spec = JobSpec(trainer="gpt", groups=4, steps=steps, seed=seed, faults="none",
                       out=out, ft=FTConfig(spares=0), sync=sync, selector=selector,
                       stragglers=None if case in ("none", "pinned", "cpu_hog") else case)
        hog = None
        if case in ("pinned", "cpu_hog"):
            hog = Hog(os.path.join(out, "groups"), HOG_GROUP, spec.groups,
                      max(os.sched_getaffinity(0)), hogs if case == "cpu_hog" else 0)
        try:
            res = Supervisor(spec).run()
        finally:
            if hog is not None:
                hog.close()
        assert res.ok, res.message
        with open(os.path.join(out, "journal.jsonl")) as f:
            events = [json.loads(line) for line in f if line.strip()]
    return {"report": res.report, "events": events, "eval_loss": final_eval_loss(spec, res),
            **({"hog": {"loops": len(hog.procs), "core": hog.core,
                        "pinned": sorted(hog.pinned)}} if hog else {})}


def final_eval_loss(spec, res) -> float | None:
    """The held-out loss of the run's final parameters (``GPTTrainer.eval_loss``: windows
    between the training windows), the same measure for every sync mode; None: not the GPT."""
    import torch

    from unbroken.runtime.trainer import make_trainer
    from unbroken.supervise.spec import check, train_config

    if spec.trainer != "gpt" or not res.params:
        return None
    tr = make_trainer(train_config(spec, spec.sdc_interval(check(spec))))
    flat = torch.tensor(next(iter(res.params.values())), dtype=torch.float64)
    i = 0
    for p in tr.params:
        p.data.copy_(flat[i:i + p.numel()].view_as(p))
        i += p.numel()
    return round(tr.eval_loss(), 6)


def losses(raw: dict) -> list[float]:
    """The loss of every data step over all its shards, in step order (a step's first
    commit's; under ``ksync`` the commit that computed its last deferred shard)."""
    from unbroken.core.stragglers import data_step_loss_points

    pts = data_step_loss_points([e for e in raw["events"] if e.get("event") == "commit"])
    return [pts[k][1] for k in sorted(pts)]


def summarise(raw: dict, target: float) -> dict:
    from unbroken.demo_report import straggler_report

    events, r = raw["events"], raw["report"]
    t0 = next(e["t"] for e in events if e.get("event") == "start")
    sr = straggler_report(events, t0, target)
    own: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for e in events:
        if e.get("event") == "commit":
            own.setdefault(e["src"], []).append(e["own_s"])
            if e.get("cpu") is not None:
                cpu.setdefault(e["src"], []).append(e["cpu"])

    def rnd(x, n=3):
        return None if x is None else round(x, n)
    return {"wall_s": rnd(r["wall_s"]), "step_s": rnd(r["step_s"], 5),
            "straggler_frequency": rnd(sr["straggler_frequency"]),
            "tta_s": rnd(sr["tta_s"]), "tta_train_s": rnd(sr["tta_train_s"]),
            "own_ms": {k: round(1e3 * statistics.median(v), 3) for k, v in sorted(own.items())},
            "cpu": {k: round(statistics.median(v), 3) for k, v in sorted(cpu.items())},
            # the slowest group's median own time over the fastest's: the trace's (or the
            # hog's) effect, which the machine's other load moves much less than step_s
            "own_ratio": round(max(map(statistics.median, own.values()))
                               / min(map(statistics.median, own.values())), 3),
            "final_loss": r["final_loss"], **({"hog": raw["hog"]} if "hog" in raw else {})}


def sampling_cost_us(batches: int = 5, n: int = 4000) -> dict:
    """Per-step cost of the resource sampling, over ``batches`` x ``n`` samples: the minimum
    batch (what it costs; other load only ever adds) and the median batch."""
    from unbroken.runtime.resources import IoCounter

    io = IoCounter()
    clock = time.thread_time
    per = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(n):  # what the runner does per step: a CPU clock around the compute
            clock()         # and one sample of the bytes sent at the commit
            clock()
            io.sent()
        per.append((time.perf_counter() - t0) / n * 1e6)
    return {"per_step_us_min": round(min(per), 2),
            "per_step_us_median": round(statistics.median(per), 2),
            "io_readable": io.fd is not None}


def _median_case(runs: list[dict]) -> dict:
    keys = ("wall_s", "step_s", "straggler_frequency", "tta_s", "tta_train_s", "own_ratio")
    out = {}
    for k in keys:
        xs = [r[k] for r in runs if r[k] is not None]
        out[k] = round(statistics.median(xs), 5) if xs else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hogs", type=int, default=5,
                    help="busy loops next to group 1 in the cpu_hog case")
    a = ap.parse_args()
    cost = sampling_cost_us()
    raws: dict[str, list[dict]] = {c: [] for c in CASES}
    for i in range(a.repeats):
        for case in CASES:
            log(f"[stragglers] repeat {i + 1}/{a.repeats}: {case}")
            raws[case].append(run_case(case, a.steps, a.seed, a.hogs))
    ref = losses(raws["none"][0])
    # the lowest committed loss of the straggler-free run's first 80 % of steps (a per-step
    # loss is one global batch's: its value at one step is first reached much earlier)
    target_step = int(0.8 * a.steps)
    target = min(ref[:target_step + 1])
    same_losses = all(losses(r) == ref for rs in raws.values() for r in rs)
    runs = {c: [summarise(r, target) for r in rs] for c, rs in raws.items()}
    summary = {c: _median_case(rs) for c, rs in runs.items()}
    base = summary["none"]["tta_train_s"]
    for c, s in summary.items():
        s["tta_train_over_none"] = (round(s["tta_train_s"] / base, 3)
                                    if base and s["tta_train_s"] else None)
    step_none = summary["none"]["step_s"]
    out = {"bench": "stragglers", "machine": {"cpus": os.cpu_count(),
                                              "python": platform.python_version()},
           "steps": a.steps, "repeats": a.repeats, "seed": a.seed, "hogs": a.hogs,
           "target_loss": target,
           "target_within_steps": target_step,
           "target_reached_at_step": next(k for k, x in enumerate(ref) if x <= target),
           "same_committed_losses_in_every_case": same_losses,
           "sampling_cost_us": {**cost, "share_of_step": round(
               cost["per_step_us_median"] * 1e-6 / step_none, 6) if step_none else None},
           "summary": summary, "runs": runs}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
