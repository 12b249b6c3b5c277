"""Where the CPU of a group-of-ranks step goes: every worker thread's CPU time per step, unbroken
(G x R, FSDP) against torch's HSDP on the same mesh. Prints ONE JSON object.

On a box with fewer cores than processes the step time follows the CPU every process burns,
the background threads' included (``bench/step_breakdown.py`` profiles the training thread
only). This samples ``/proc/<pid>/task/<tid>/stat`` (utime + stime) of every worker every
20 ms and charges the CPU between two commits (steps ``WARM`` .. ``steps - 2``) per step, per
thread kind: the main thread, the Python threads named by ``py-spy dump`` (heartbeat,
doorbell, health agent, ...) and the rest (gloo's and torch's native threads).

Usage: ``.venv/bin/python bench/rank_cpu.py [--steps 80] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rank_groups import GPT, hsdp_procs  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

WARM = 10
TICK = os.sysconf("SC_CLK_TCK")


def cfg_of(steps: int) -> TrainConfig:
    return TrainConfig(groups=4, redundancy=2, steps=steps, seed=5, model="gpt",
                       shard_size=8, trainer_args=GPT, ranks_per_group=2, shard="fsdp")


class Sampler:
    """Every 20 ms: (t, {pid: {tid: cpu_s}}) of the given pids."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.samples: list[tuple[float, dict]] = []
        self.names: dict[int, dict[int, str]] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        self.own_tid = threading.get_native_id()  # this sampler: not charged
        while not self._stop.wait(0.02):
            snap = {}
            for pid in list(self.pids) + [os.getpid()]:
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                per = {}
                for tid in tids:
                    try:
                        with open(f"/proc/{pid}/task/{tid}/stat") as f:
                            parts = f.read().rsplit(")", 1)[1].split()
                        per[int(tid)] = (int(parts[11]) + int(parts[12])) / TICK
                    except (OSError, IndexError, ValueError):
                        pass
                snap[pid] = per
            self.samples.append((time.time(), snap))

    def name_threads(self) -> None:
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        for pid in self.pids:
            try:
                out = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)],
                                     capture_output=True, text=True, timeout=20).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            # "Thread <tid> (idle): "<name>"": py-spy names a thread by its native id here
            self.names[pid] = {int(m.group(1)): m.group(2) for m in re.finditer(
                r'Thread (\d+) \((?:active|idle)[^)]*\): "([^"]+)"', out)}

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def at(self, t: float) -> dict:
        best = min(self.samples, key=lambda s: abs(s[0] - t))
        return best[1]


def kind(name: str | None, tid: int, pid: int) -> str:
    if tid == pid:
        return "main"
    if name is None:
        return "native"
    return re.sub(r"[-_]\d+$", "", name)


def charge(s: Sampler, t0: float, t1: float, steps: int) -> dict:
    a, b = s.at(t0), s.at(t1)
    per_proc = []
    me = os.getpid()
    # the launcher's threads but the sampler's (its store server: the workers' round trips)
    launcher = sum(cpu - a.get(me, {}).get(tid, 0.0) for tid, cpu in b.get(me, {}).items()
                   if tid != s.own_tid)
    for pid in b:
        if pid not in a or pid == me:
            continue
        kinds: dict[str, float] = {}
        for tid, cpu in b[pid].items():
            k = kind(s.names.get(pid, {}).get(tid), tid, pid)
            kinds[k] = kinds.get(k, 0.0) + cpu - a[pid].get(tid, 0.0)
        kinds["total"] = sum(kinds.values())
        per_proc.append({k: 1e3 * v / steps for k, v in kinds.items()})
    keys = sorted({k for p in per_proc for k in p})
    return {"procs": len(per_proc), "wall_ms": round(1e3 * (t1 - t0) / steps, 2),
            "launcher_ms": round(1e3 * launcher / steps, 2),
            "sum_ms": {k: round(sum(p.get(k, 0.0) for p in per_proc), 2) for k in keys},
            "median_ms": {k: round(statistics.median(p.get(k, 0.0) for p in per_proc), 2)
                          for k in keys}}


def run_unbroken(steps: int) -> dict:
    cfg = cfg_of(steps)
    s = Sampler()
    with tempfile.TemporaryDirectory() as d:
        with StackedCluster(cfg, d) as c:
            s.pids = [p for u in range(4) for p in c.procs[u].pids]
            while True:
                ts = [e for e in c.journal(0) if e["event"] == "commit"]
                if len(ts) > steps // 2:
                    break
                time.sleep(0.2)
            s.name_threads()
            for u in range(4):
                c.wait_key(f"done/{u}", 600, alive=list(range(4)))
            ts = [e["t"] for e in c.journal(0) if e["event"] == "commit"]
    s.stop()
    return charge(s, ts[WARM], ts[-2], len(ts) - 2 - WARM)


def run_hsdp(steps: int) -> dict:
    s = Sampler()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        procs = hsdp_procs(cfg_of(steps), out, stderr=subprocess.DEVNULL)
        s.pids = [p.pid for p in procs]
        time.sleep(8)  # started and training: name its threads (the main one is the pid)
        s.name_threads()
        for p in procs:
            p.wait(timeout=600)
        with open(out) as f:
            ts = json.load(f)["t"]
    s.stop()
    return charge(s, ts[WARM], ts[-2], len(ts) - 2 - WARM)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=["unbroken", "hsdp"], default=None)
    a = ap.parse_args()
    res: dict[str, list] = {"unbroken": [], "hsdp": []}
    for i in range(a.rounds):
        for name, fn in [("unbroken", run_unbroken), ("hsdp", run_hsdp)][::1 if i % 2 == 0
                                                                         else -1]:
            if a.only and name != a.only:
                continue
            res[name].append(fn(a.steps))
            print(name, json.dumps(res[name][-1]), file=sys.stderr, flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
