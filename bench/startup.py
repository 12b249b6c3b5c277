"""Launch -> first committed step: ``unbroken run`` against ``torchrun`` plain data parallelism.
Prints ONE JSON object; progress goes to stderr.

What a user waits for before training starts, and what a restart or a fresh job pays again.
Both start 4 ranks of the same model (the byte-level GPT, ``TrainConfig(model="gpt")``,
AdamW, 1 torch thread per process) on this machine and train ``--steps`` steps:

* ``unbroken``: ``unbroken run --trainer gpt --groups 4 --spares 0 --faults none --steps S
  --out DIR --json`` as a subprocess (the supervisor checks the trainer, starts the store host
  and 4 workers forked from its preloaded fork server, ``unbroken.spawn``);
* ``torchrun``: ``python -m torch.distributed.run --standalone --nproc-per-node 4
  bench/baselines/torchrun_worker.py`` (4 fresh interpreters, each importing torch and
  building its trainer; rank 0 saves a checkpoint every step, as in ``kill_baselines``).

``first_step_s``: from the launch (``time.time()`` just before ``Popen``) to the last rank's
commit of step 0, read from the run's journal; ``wall_s``: launch to exit. The cases alternate
within each repeat (order rotated) and the medians over ``--repeats`` are reported with their
ratios (unbroken / torchrun).

Usage: ``.venv/bin/python bench/startup.py [--repeats 5] [--steps 5]``.
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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GROUPS = 4


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def _jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def unbroken_once(steps: int, seed: int) -> dict:
    exe = os.path.join(os.path.dirname(sys.executable), "unbroken")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "run")
        cmd = [exe, "run", "--trainer", "gpt", "--groups", str(GROUPS), "--spares", "0",
               "--faults", "none", "--steps", str(steps), "--seed", str(seed), "--out", out,
               "--json"]
        t0 = time.time()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        t_end = time.time()
        if p.returncode != 0:
            raise AssertionError(f"unbroken run rc={p.returncode}: {p.stderr[-800:]!r}")
        ev = _jsonl(os.path.join(out, "journal.jsonl"))
    first = max(e["t"] for e in ev if e.get("event") == "commit" and e["step"] == 0)
    start = next(e["t"] for e in ev if e.get("event") == "start")
    return {"first_step_s": first - t0, "wall_s": t_end - t0, "to_start_event_s": start - t0}


def torchrun_once(steps: int, seed: int) -> dict:
    from unbroken.runtime.config import TrainConfig

    cfg = TrainConfig(model="gpt", groups=GROUPS, redundancy=2, steps=steps, seed=seed)
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(GROUPS), "--max-restarts", "0",
               os.path.join(HERE, "baselines", "torchrun_worker.py"),
               "--config", cfg.to_json(), "--out", d, "--ckpt", os.path.join(d, "ckpt.pt")]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        t0 = time.time()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                           timeout=300)
        t_end = time.time()
        if p.returncode != 0:
            raise AssertionError(f"torchrun rc={p.returncode}: {p.stderr[-800:]!r}")
        first = max(next(e["t"] for e in _jsonl(os.path.join(d, f"tr-{r}.jsonl"))
                         if e["event"] == "commit" and e["step"] == 0) for r in range(GROUPS))
    return {"first_step_s": first - t0, "wall_s": t_end - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    cases = {"unbroken": unbroken_once, "torchrun": torchrun_once}
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    t_all = time.time()
    for i in range(a.repeats):
        order = list(cases)[i % 2:] + list(cases)[:i % 2]
        for c in order:
            r = cases[c](a.steps, seed=i)
            log(f"[startup] repeat {i + 1}/{a.repeats} {c}: first step {r['first_step_s']:.2f} s, "
                f"exit {r['wall_s']:.2f} s")
            runs[c].append(r)

    def med(c: str, k: str) -> float:
        return round(statistics.median(r[k] for r in runs[c]), 3)

    summary = {c: {k: med(c, k) for k in runs[c][0]} for c in cases}
    print(json.dumps({
        "bench": "startup", "groups": GROUPS, "steps": a.steps, "repeats": a.repeats,
        "model": "gpt", "summary": summary,
        "first_step_unbroken_over_torchrun": round(summary["unbroken"]["first_step_s"]
                                                   / summary["torchrun"]["first_step_s"], 3),
        "wall_unbroken_over_torchrun": round(summary["unbroken"]["wall_s"]
                                             / summary["torchrun"]["wall_s"], 3),
        "runs": runs, "python": platform.python_version(), "cpus": os.cpu_count(),
        "loadavg_at_end": list(os.getloadavg()), "wall_s": round(time.time() - t_all, 1)},
        indent=1))


if __name__ == "__main__":
    main()
