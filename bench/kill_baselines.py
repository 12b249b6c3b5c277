"""Kill -> next committed step: ours vs what a user has instead (torchft, torchrun restart).

Prints ONE JSON object on stdout (progress on stderr). 4 groups of one process each, the same
model (``make_trainer(TrainConfig(model=...))``: ``gpt`` when ``unbroken.runtime.gpt`` exists,
else ``mlp``), the same machine, every case in this one run, ``--repeats`` repeats per case
(rotating the victim), median / min / max. All timestamps are wall clock (``time.time()``)
written by the workers themselves; the victim writes its own kill time just before it SIGKILLs
itself after computing the gradient of step ``DIE_AT`` and before that step's all-reduce (the
same fault point in every case).

1. ``ours``: a fresh ``StackedCluster`` (groups 4, redundancy 2, heartbeat 0.1 s, staleness
   1.0 s) per repeat, as ``bench/train_bars.py`` (``notified`` mode): the launcher waits for the
   victim's exit and posts ``declare_dead``. Metric: victim's ``killed/<uid>`` time -> the *last*
   survivor's journal ``commit`` of step ``DIE_AT`` (the survivors mask the dead group and
   commit the very step it died in).
2. ``torchft`` (torchft-nightly, CPU): an in-process ``LighthouseServer`` per repeat, 4 replica
   groups (``bench/baselines/torchft_worker.py``: ``Manager`` + ``torchft.ProcessGroupGloo``,
   manual ``manager.allreduce`` of the flat gradient, ``should_commit``). Metric: kill time ->
   the *last* survivor's first committed step (``should_commit`` true) after the kill; the first
   survivor's is reported too. Three settings (values in ``TORCHFT_CASES`` and the JSON):
   ``default`` (torchft's default heartbeat timeout and its example's timeouts),
   ``aggressive`` (the smallest heartbeat / tick / join / collective timeouts found to run
   stably on this machine) and ``library_defaults`` (nothing set; 60 s, so one repeat).
3. ``torchrun``: ``python -m torch.distributed.run --standalone --nproc-per-node 4
   --max-restarts 1`` of ``bench/baselines/torchrun_worker.py`` (plain DP: one flat-gradient
   gloo all-reduce, ``torch.save`` + ``os.replace`` checkpoint every step); one rank SIGKILLs
   itself; the elastic agent restarts all four, they load the checkpoint. Metric: kill time ->
   the last rank's first committed step of the restarted attempt.

Ratios are baseline median / ours median. Every subprocess has a hard timeout and is killed
(its whole process group) on exit.

Usage: ``.venv/bin/python bench/kill_baselines.py [--repeats 3] [--model gpt|mlp]
[--cases ours,torchft_default,torchft_aggressive,torchrun]``.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch

from unbroken.runtime.ftcomm import declare_dead
from unbroken.runtime.config import TrainConfig
from unbroken.runtime.trainer import make_trainer
from unbroken.supervise.local import StackedCluster

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N, R = 4, 2
DIE_AT = 8
HEARTBEAT, STALENESS = 0.1, 1.0
CASE_TIMEOUT_S = 120.0  # hard limit per repeat of any case

# torchft settings (lighthouse flags; worker: torchft.ProcessGroupGloo timeout, Manager timeout /
# quorum_timeout / heartbeat_interval; unset = the library default).
# * "default": the heartbeat and timeouts torchft ships in its own example (train_ddp.py:
#   ProcessGroupGloo(timeout=5 s), Manager(timeout=10 s)); lighthouse at its defaults
#   (--heartbeat_timeout_ms 5000 --quorum_tick_ms 100 --join_timeout_ms 60000), --min_replicas 1.
# * "library_defaults": nothing set at all (ProcessGroupGloo and Manager timeouts 60 s). With 4
#   groups on gloo a survivor that waits on another survivor is stuck in the collective for
#   the PG timeout (gloo-failures.md sec. 3), and its peers' quorum times out at the same 60 s:
#   60 s recovery or a crashed survivor. Slow, so fewer repeats.
# * "aggressive": the smallest values that ran stably here (see the bench notes).
TORCHFT_CASES = {
    "torchft_default": {
        "lighthouse": {"min_replicas": 1},
        "worker": {"pg_timeout_s": 5.0, "manager_timeout_s": 10.0}},
    "torchft_aggressive": {
        "lighthouse": {"min_replicas": 1, "heartbeat_timeout_ms": 300, "quorum_tick_ms": 10,
                       "join_timeout_ms": 150},
        "worker": {"pg_timeout_s": 0.6, "manager_timeout_s": 2.0, "quorum_timeout_s": 10.0,
                   "heartbeat_interval_ms": 50}},
    "torchft_library_defaults": {"lighthouse": {"min_replicas": 1}, "worker": {}},
}


_LIVE: list[subprocess.Popen] = []


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def _kill_all() -> None:
    for p in _LIVE:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


atexit.register(_kill_all)


def spawn(cmd: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    p = subprocess.Popen(cmd, env=env, start_new_session=True, **kw)
    _LIVE.append(p)
    return p


def reap(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if p in _LIVE:
            _LIVE.remove(p)


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        out = []
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written right now
                pass
        return out


def summary(xs: list[float]) -> dict:
    return {"median_s": round(statistics.median(xs), 4), "min_s": round(min(xs), 4),
            "max_s": round(max(xs), 4), "runs_s": [round(x, 4) for x in xs]}


# ------------------------------------------------------------------ 1. ours
def ours_once(cfg_kw: dict, victim: int) -> dict:
    cfg = TrainConfig(groups=N, redundancy=R, steps=DIE_AT + 3, seed=3, **cfg_kw)
    survivors = [u for u in range(N) if u != victim]
    with tempfile.TemporaryDirectory() as d:
        with StackedCluster(cfg, d, die_at={victim: DIE_AT}, heartbeat=HEARTBEAT,
                            staleness=STALENESS) as c:
            t_kill = float(c.wait_key(f"killed/{victim}", CASE_TIMEOUT_S, alive=survivors))
            rc = c.procs[victim].wait(timeout=10)
            declare_dead(c.store, victim)
            for u in survivors:
                c.wait_key(f"done/{u}", CASE_TIMEOUT_S, alive=survivors)
            for u in survivors:
                c.procs[u].wait(timeout=30)
            journals = {u: c.journal(u) for u in survivors}
    commit = {u: next(e for e in journals[u] if e["event"] == "commit" and e["step"] == DIE_AT)
              for u in survivors}
    ts = [commit[u]["t"] - t_kill for u in survivors]
    return {"victim": victim, "rc": rc, "last_s": max(ts), "first_s": min(ts),
            "ok": rc == -9 and all(commit[u]["members"] == survivors for u in survivors)}


# ------------------------------------------------------------------ 2. torchft
def torchft_once(cfg_kw: dict, victim: int, settings: dict) -> dict:
    import torch.distributed as dist

    cfg = TrainConfig(groups=N, redundancy=R, steps=DIE_AT + 3, seed=3, **cfg_kw)
    survivors = [u for u in range(N) if u != victim]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as d:
        errs = [open(os.path.join(d, f"err-{u}"), "wb") for u in range(N)]
        lh_log = open(os.path.join(d, "lighthouse.log"), "wb")
        lh_port = free_port()
        lh_cmd = [os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse"),
                  "--bind", f"[::]:{lh_port}"]
        for k, v in settings["lighthouse"].items():
            lh_cmd += [f"--{k}", str(v)]
        lh = spawn(lh_cmd, stdout=lh_log, stderr=subprocess.STDOUT)
        try:
            for u in range(N):
                cmd = [sys.executable, os.path.join(HERE, "baselines", "torchft_worker.py"),
                       "--replica", str(u), "--lighthouse", f"http://127.0.0.1:{lh_port}",
                       "--port", str(store.port), "--config", cfg.to_json(), "--out", d]
                for k, v in settings["worker"].items():
                    cmd += ["--" + k.replace("_", "-"), str(v)]
                if u == victim:
                    cmd += ["--die-at", str(DIE_AT)]
                procs.append(spawn(cmd, stdout=subprocess.DEVNULL, stderr=errs[u]))
            deadline = time.monotonic() + CASE_TIMEOUT_S
            while store.add("ready", 0) < N:
                _poll(procs, deadline, d)
            store.set("go", "1")
            kill_file = os.path.join(d, f"killed-{victim}")
            live = list(survivors)
            crashed: dict[int, int] = {}
            # until every live survivor has committed 2 steps >= DIE_AT (a survivor that exits
            # with an error, e.g. torchft's quorum timeout, is recorded and no longer waited on)
            while True:
                for u in list(live):
                    if procs[u].poll() is not None:
                        crashed[u] = procs[u].returncode
                        live.remove(u)
                if not live:
                    raise AssertionError(f"every survivor crashed: {crashed}")
                _poll([procs[u] for u in live], deadline, d)
                if not os.path.exists(kill_file):
                    continue
                with open(kill_file) as f:
                    txt = f.read()
                if not txt:
                    continue
                try:
                    kill = json.loads(txt)
                except json.JSONDecodeError:  # being written
                    continue
                t_kill, k_kill = kill["t"], kill["step"]
                js = {u: read_jsonl(os.path.join(d, f"tf-{u}.jsonl")) for u in survivors}
                after = {u: [e for e in js[u] if e["commit"] and e["step"] >= k_kill]
                         for u in survivors}
                if all(len(after[u]) >= 2 for u in live):
                    break
            store.set("stop", "1")
            for u in live:
                procs[u].wait(timeout=30)
            rc = procs[victim].wait(timeout=10)
            before = {u: [e for e in js[u] if e["commit"] and e["step"] < k_kill]
                      for u in survivors}
            failed = {u: [e for e in js[u] if not e["commit"] and e["t"] > t_kill]
                      for u in survivors}
            failed_before = sum(1 for u in survivors for e in js[u]
                                if not e["commit"] and e["t"] <= t_kill)
            for u in crashed:
                with open(os.path.join(d, f"err-{u}"), "rb") as f:
                    lines = f.read().decode(errors="replace").splitlines()
                crashed[u] = f"rc={crashed[u]}: " + next(
                    (x for x in reversed(lines) if x and not x.startswith(" ")
                     and "[INFO]" not in x), "?")[:160]
        except BaseException:
            for u in range(N):
                errs[u].flush()
                with open(os.path.join(d, f"err-{u}"), "rb") as f:
                    lines = f.read().decode(errors="replace").splitlines()
                tail = "\n".join(x for x in lines if "[INFO]" not in x)[-4000:]
                if tail:
                    log(f"    torchft replica {u} stderr tail:\n{tail}")
            raise
        finally:
            reap(procs + [lh])
            for f in errs:
                f.close()
            lh_log.close()
            del store
    firsts = {u: after[u][0] for u in live}
    ts = [firsts[u]["t"] - t_kill for u in live]
    return {
        "victim": victim, "rc": rc, "last_s": max(ts), "first_s": min(ts),
        "participants_before_kill": min((before[u][-1]["participants"] if before[u] else 0)
                                        for u in survivors),
        "participants_after": max(firsts[u]["participants"] for u in live),
        "failed_steps_after_kill": sum(len(failed[u]) for u in survivors),
        "failed_steps_before_kill": failed_before, "kill_step": k_kill,
        "survivors_crashed": crashed,
        "ok": rc == -9 and not crashed and failed_before == 0 and all(
            before[u] and before[u][-1]["participants"] == N for u in survivors),
    }


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::", 0))
        return s.getsockname()[1]


def _poll(procs: list[subprocess.Popen], deadline: float, d: str) -> None:
    """Wait a little on a worker's exit (an event we care about); fail on exit or timeout."""
    for p in procs:
        if p.poll() is not None:
            raise AssertionError(f"worker pid {p.pid} exited rc={p.returncode}")
    if time.monotonic() > deadline:
        raise TimeoutError(f"case did not finish within {CASE_TIMEOUT_S} s")
    try:
        procs[0].wait(timeout=0.01)
    except subprocess.TimeoutExpired:
        pass


# ------------------------------------------------------------------ 3. torchrun restart
def torchrun_once(cfg_kw: dict, victim: int) -> dict:
    cfg = TrainConfig(groups=N, redundancy=R, steps=DIE_AT + 3, seed=3, **cfg_kw)
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(N), "--max-restarts", "1",
               os.path.join(HERE, "baselines", "torchrun_worker.py"),
               "--config", cfg.to_json(), "--out", d, "--ckpt", os.path.join(d, "ckpt.pt"),
               "--die-at", str(DIE_AT), "--die-rank", str(victim)]
        err = open(os.path.join(d, "err"), "wb")
        p = spawn(cmd, stdout=subprocess.DEVNULL, stderr=err)
        try:
            rc = p.wait(timeout=CASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            reap([p])
            err.close()
        with open(os.path.join(d, "err"), "rb") as f:
            errtail = f.read()[-1500:].decode(errors="replace")
        if rc != 0:
            log(f"    torchrun rc={rc}; stderr tail:\n{errtail}")
            raise AssertionError(f"torchrun exited rc={rc}")
        with open(os.path.join(d, "killed")) as f:
            t_kill = float(f.read())
        js = {r: read_jsonl(os.path.join(d, f"tr-{r}.jsonl")) for r in range(N)}
    first = {r: next(e for e in js[r] if e["event"] == "commit" and e["attempt"] == 1)
             for r in range(N)}
    start = {r: next(e for e in js[r] if e["event"] == "start" and e["attempt"] == 1)
             for r in range(N)}
    ts = [first[r]["t"] - t_kill for r in range(N)]
    return {
        "victim": victim, "last_s": max(ts), "first_s": min(ts),
        "resume_step": start[0]["resume_step"],
        "kill_to_restarted_procs_s": min(s["t_proc_start"] for s in start.values()) - t_kill,
        "kill_to_ckpt_loaded_s": max(s["t"] for s in start.values()) - t_kill,
        "ok": first[0]["step"] == DIE_AT and start[0]["resume_step"] == DIE_AT,
    }


# ------------------------------------------------------------------ driver
def run_case(name: str, fn, repeats: int) -> dict:
    runs = []
    for i in range(repeats):
        victim = (i + 1) % N
        r = fn(victim)
        runs.append(r)
        log(f"  {name} rep {i}: victim {victim} last {r['last_s'] * 1e3:.0f} ms, "
            f"first {r['first_s'] * 1e3:.0f} ms, ok={r['ok']}")
    out = summary([r["last_s"] for r in runs])
    out["first_survivor"] = summary([r["first_s"] for r in runs])
    out["victims"] = [r["victim"] for r in runs]
    out["all_ok"] = all(r["ok"] for r in runs)
    extra = {k for r in runs for k in r} - {"victim", "last_s", "first_s", "ok", "rc"}
    for k in sorted(extra):
        vals = [r[k] for r in runs]
        out[k] = vals
    return out


NOTES = (
    "Fault point is the same in every case: the victim SIGKILLs itself after computing the "
    "gradient of step %d (for torchft: of the first step >= %d whose quorum holds all 4 groups, "
    "after wait_quorum) and before that step's all-reduce, having written its wall time first. "
    "Latency = that time -> the LAST survivor's first committed step after it (ours: commit of "
    "the very step the victim died in, its shard patched in by a redundant host; torchft: "
    "first should_commit()==True step, the failed step is dropped and its samples lost; "
    "torchrun: the restarted job's first step, resumed from the every-step checkpoint). "
    "torchft runs a manual flat-gradient manager.allreduce(SUM) + should_commit (its "
    "DistributedDataParallel wrapper is not needed; 0.2.0's crashes the survivor, "
    "gloo-failures.md sec. 4). With 4 groups on gloo, a survivor waiting on another "
    "survivor stays blocked in the collective until the torchft.ProcessGroupGloo timeout, so "
    "torchft's recovery is max(heartbeat_timeout, PG timeout) plus a quorum; at the library "
    "defaults (PG, Manager and quorum timeouts all 60 s, join_timeout 60 s) the blocked "
    "survivor's peers race their 60 s quorum timeout: recovery is about 60 s, or a survivor "
    "crashes with 'TimeoutError: status: Cancelled, Timeout expired' (seen 2 of 3 tries while "
    "building this bench). Aggressive settings were searched on this 2-core box with 3-4 "
    "repeats each: heartbeat_timeout 200 ms / join 100 ms / PG 0.5 s was not stable (a live "
    "replica dropped from the quorum, 3 failed steps before any kill, 1 of 3 runs); 300 ms / "
    "150 ms / 0.6 s and 500 ms / 300 ms / 1.0 s were (medians 0.80 s and 0.77 s in 4-repeat "
    "probe runs, 0.3-1.4 s per run: noisy); quorum_tick 10 ms and heartbeat_interval 50 ms in "
    "both. After the kill the survivors' first commits run with 2 participants "
    "(participants_after): join_timeout leaves the survivor still blocked in the old "
    "collective out of the first new quorum. torchrun: the restarted workers' default env:// gloo init "
    "read the dead attempt's addresses from the agent's surviving store ('connectFullMesh "
    "failed ... Connection refused'), so the worker inits the PG under a per-attempt "
    "PrefixStore; most of its time is the agent's stop + restart and 4 fresh Python/torch "
    "imports on 2 cores. Noisy shared 2-core machine: orders of magnitude, not precise ratios."
    % (DIE_AT, DIE_AT))


def default_model() -> str:
    return "gpt" if importlib.util.find_spec("unbroken.runtime.gpt") is not None else "mlp"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", choices=["gpt", "mlp"], default=None,
                    help="default: gpt if unbroken.runtime.gpt exists, else mlp")
    ap.add_argument("--cases", default="ours,torchft_default,torchft_aggressive,torchrun,"
                    "torchft_library_defaults")
    ap.add_argument("--library-default-repeats", type=int, default=1)
    a = ap.parse_args()
    model = a.model or default_model()
    cfg_kw = {"model": model}
    cases = a.cases.split(",")
    t0 = time.monotonic()
    tr = make_trainer(TrainConfig(groups=N, redundancy=R, seed=3, **cfg_kw))
    out: dict = {
        "bench": "kill_baselines", "groups": N, "processes_per_group": 1, "die_at_step": DIE_AT,
        "model": model, "model_params": int(tr.numel), "repeats": a.repeats,
        "torch": torch.__version__, "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    del tr
    try:
        from importlib.metadata import version
        out["torchft_version"] = "torchft-nightly " + version("torchft-nightly")
    except Exception:  # noqa: BLE001
        out["torchft_version"] = None
    res: dict = {}
    if "ours" in cases:
        log("ours (StackedCluster, notified)")
        res["ours"] = run_case("ours", lambda v: ours_once(cfg_kw, v), a.repeats)
        res["ours"]["settings"] = {"redundancy": R, "heartbeat_s": HEARTBEAT,
                                   "staleness_s": STALENESS, "death_notice": True}
    for name, st in TORCHFT_CASES.items():
        if name in cases:
            log(name)
            reps = a.library_default_repeats if name == "torchft_library_defaults" else a.repeats
            res[name] = run_case(name, lambda v, st=st: torchft_once(cfg_kw, v, st), reps)
            res[name]["settings"] = st
    if "torchrun" in cases:
        log("torchrun restart")
        res["torchrun"] = run_case("torchrun", lambda v: torchrun_once(cfg_kw, v), a.repeats)
        res["torchrun"]["settings"] = {"max_restarts": 1, "monitor_interval_s": 0.1,
                                       "rdzv": "standalone c10d", "checkpoint": "every step"}
    out["cases"] = res
    if "ours" in res:
        o = res["ours"]["median_s"]
        for name, key in (("torchft_default", "torchft_default_over_ours"),
                          ("torchft_aggressive", "torchft_aggressive_over_ours"),
                          ("torchrun", "torchrun_over_ours"),
                          ("torchft_library_defaults", "torchft_library_defaults_over_ours")):
            if name in res:
                out[key] = round(res[name]["median_s"] / o, 2)
    out["notes"] = NOTES
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
