"""The NCCL path of the runtime on this machine's GPUs: a kill and a hang, and the failure-free
step against plain DDP. Run it through ``bash bench/gpu_check.sh`` (it makes the venv and says
so when there is no GPU). Prints ONE JSON object on stdout (progress on stderr); exit 1 when a
run of the runtime (or of the baseline) failed, 0 otherwise. Not part of ``make test``.

Every run is the product as a user starts it: ``python -m unbroken run --trainer gpt --device
cuda ... --json`` in a subprocess (the supervisor, its store, a process per rank with a GPU of
its own: ``TrainConfig.local_device``), out dirs under ``out/gpu_check/`` (kept for a failed
run). What runs depends on the GPU count n (``torch.cuda.device_count()``):

* **refusal** (every n): ``--device cuda`` with more processes than GPUs (G = n + 1 groups, no
  spare) must be one line and exit 2 with nothing started (``supervise.spec.check_device``).
  With n = 1 that is all: a job needs G >= 2 groups and NCCL refuses two ranks of one
  communicator on one GPU, so no job of the runtime fits on one GPU.
* **kill and hang**, R = 1 (n >= 3) and R = 2 (n >= 6, ``--shard fsdp``): G = 3 groups with
  redundancy r = 2, so one lost group is masked (n = 2 would mean G = 2, r = 1: a kill is a
  wipe-out whose replacement process, uid 2, wraps around onto cuda:0, a GPU already in the
  communicator; not run). One run ``--faults kill:1@S``, one ``--faults hang:2@S`` (the
  group's rank 0), each with one warm spare when the GPUs allow ((G + 1) x R: n >= 4 for
  R = 1, n >= 8 for R = 2; it then joins over NCCL), else ``--spares 0``. Kill and hang are
  separate runs: in one run the second fault's replacement would be a spare started after the
  first (uid G + 1 or later), which wraps around onto a GPU in use. kill -> commit: from the
  worker's own ``fault`` event (written just before it SIGKILLs itself / starts hanging) to
  the last live group's commit of step S (its journal). The run must exit 0 with
  ``exactly_once`` and every step.
* **step time** (n >= 2): G = min(n, 8) groups x R = 1 (r = 2, or 1 at G = 2), no fault,
  against torch's ``DistributedDataParallel`` over one NCCL process group on the same GPUs
  (this file run as ``--ddp-worker``): the same trainer (``make_trainer`` on the config the
  CLI builds, ``supervise.spec.train_config``), rank k computing shard type k of every step,
  DDP averaging the gradients, the same AdamW. unbroken's step: the interval between a
  group's ``commit`` events; DDP's: between the ends of its steps (after ``float(loss)``, which
  waits for the step's kernels, as a training loop that logs its loss does). Medians after
  ``WARMUP`` steps over every group / rank; both runs' last-step loss (the mean over the
  shard types) must agree (``final_loss_diff``): they compute the same thing.

Rounds: every check once, then again (which of unbroken / DDP goes first alternates) while the
next round fits in ``--budget-s`` (the measured part; default 210 s, so the whole check stays
under 5 minutes once the venv exists), at most ``--repeats`` rounds; the JSON gives the
medians over rounds and every run. A check that failed is not repeated.

``--device cpu --gpus N`` runs the same plan on gloo as if there were N GPUs: a test of this
script on a machine without GPUs (its times say nothing about GPUs).

Usage: ``bash bench/gpu_check.sh [--repeats 3] [--budget-s 210]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "out", "gpu_check")
FAULT_STEPS, FAULT_AT = 30, 10
STEP_STEPS, WARMUP = 50, 10
RUN_TIMEOUT_S = 150.0     # one run (start-up, CUDA and NCCL init included)
LOSS_TOL = 1e-6           # |unbroken - DDP| last-step loss: the same computation
#: a GPT big enough that a step is more than kernel launches on a GPU (3.3 M float64 params)
GPT_CUDA = ({"seq_len": 128, "d_model": 256, "n_layer": 4, "n_head": 8}, 16)
GPT_CPU = ({"seq_len": 32, "d_model": 32, "n_layer": 1, "n_head": 2}, 8)  # --device cpu


def log(*a: object) -> None:
    print("gpu_check:", *a, file=sys.stderr, flush=True)


def plan(n: int) -> dict:
    """What runs with ``n`` GPUs (pure): the fault layouts per R (or why not), the step layout
    (or why not)."""
    faults = {}
    for r in (1, 2):
        need = 3 * r
        if n < need:
            faults[f"R={r}"] = {"skipped": f"needs {need} GPUs (G = 3 groups x R = {r}, one GPU "
                                           f"a process), {n} here"}
        else:
            faults[f"R={r}"] = {"groups": 3, "ranks_per_group": r, "redundancy": 2,
                                "spares": 1 if n >= 4 * r else 0}
    if n < 2:
        step = {"skipped": f"needs 2 GPUs (G >= 2 groups, one GPU a process), {n} here"}
    else:
        g = min(n, 8)
        step = {"groups": g, "ranks_per_group": 1, "redundancy": 2 if g >= 3 else 1}
    return {"gpus": n, "faults": faults, "step": step}


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 6) if xs else None


# ------------------------------------------------------------------ one run of the runtime
def unbroken_cmd(a: argparse.Namespace, out: str, groups: int, ranks: int, redundancy: int,
                 steps: int, faults: str, spares: int, groups_arg: int | None = None) -> list:
    gpt, shard = GPT_CUDA if a.device == "cuda" else GPT_CPU
    cmd = [sys.executable, "-m", "unbroken", "run", "--trainer", "gpt",
           "--trainer-args", json.dumps(gpt), "--shard-size", str(shard),
           "--groups", str(groups_arg or groups), "--redundancy", str(redundancy),
           "--steps", str(steps), "--seed", "0", "--faults", faults, "--spares", str(spares),
           "--device", a.device, "--out", out, "--json"]
    if ranks > 1:
        cmd += ["--ranks-per-group", str(ranks), "--shard", "fsdp"]
    return cmd


def run_proc(cmd: list, timeout: float, env: dict | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr); on a timeout SIGTERM (the supervisor stops its workers),
    then SIGKILL to the whole session, and exit code 124."""
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
        return 124, out, err + f"\n(timed out after {timeout:.0f} s)"


def journal(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def group_journals(out: str) -> dict[int, list[dict]]:
    d = os.path.join(out, "groups")
    got = {}
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.startswith("group-") and name.endswith(".jsonl"):
            got[int(name[len("group-"):-len(".jsonl")])] = journal(os.path.join(d, name))
    return got


def fault_to_commit(events: list[dict], groups: dict[int, list[dict]], kind: str
                    ) -> dict | None:
    """(pure) From the ``fault`` event of ``kind`` to the last live group's first commit of
    that step after it: {step, victim uid, seconds, the groups counted}; None without one."""
    f = next((e for e in events if e.get("event") == "fault" and e.get("kind") == kind), None)
    if f is None:
        return None
    t0, step, victim = float(f["t"]), f.get("step"), f.get("uid", f.get("group"))
    ends = {}
    for u, evs in groups.items():
        if u == victim:
            continue
        t = next((float(e["t"]) for e in evs if e.get("event") == "commit"
                  and e.get("step") == step and float(e["t"]) >= t0), None)
        if t is not None:
            ends[u] = t
    if not ends:
        return None
    return {"step": step, "victim": victim, "s": round(max(ends.values()) - t0, 6),
            "groups": sorted(ends)}


def step_intervals(ts: list[float], warmup: int) -> list[float]:
    ts = ts[warmup:]
    return [b - a for a, b in zip(ts, ts[1:])]


def check_report(rep: dict | None, steps: int, faults: int) -> str | None:
    """Why a run's report is not a good run (None when it is)."""
    if not isinstance(rep, dict):
        return "no JSON report"
    if rep.get("steps") != steps:
        return f"{rep.get('steps')} of {steps} steps"
    if rep.get("exactly_once") is not True:
        return f"not exactly once (ledger {rep.get('ledger')})"
    if rep.get("faults_injected") != faults:
        return f"{rep.get('faults_injected')} faults injected, {faults} scheduled"
    return None


def fault_run(a: argparse.Namespace, lay: dict, kind: str, i: int) -> dict:
    r, g = lay["ranks_per_group"], lay["groups"]
    victim = 1 if kind == "kill" else 2
    out = os.path.join(OUT, f"{kind}-R{r}-{i}")
    cmd = unbroken_cmd(a, out, g, r, lay["redundancy"], FAULT_STEPS,
                       f"{kind}:{victim}@{FAULT_AT}", lay["spares"])
    t0 = time.time()
    code, stdout, stderr = run_proc(cmd, RUN_TIMEOUT_S)
    rec: dict = {"rc": code, "wall_s": round(time.time() - t0, 2)}
    rep = _report(stdout)
    why = f"exit {code}: {_tail(stderr)}" if code != 0 else check_report(rep, FAULT_STEPS, 1)
    got = fault_to_commit(journal(os.path.join(out, "journal.jsonl")), group_journals(out), kind)
    if why is None and got is None:
        why = f"no {kind} event or no commit of step {FAULT_AT} after it in the journals"
    if got is not None:
        rec["to_commit_s"] = got["s"]
    cost = next((c for c in (rep or {}).get("time_lost_per_fault", [])
                 if c.get("kind") == kind), {})
    rec.update({k: round(v, 6) if isinstance(v, float) else v for k, v in cost.items()
                if k in ("detect_s", "lost_s", "masked", "how")})
    rec["joins"] = (rep or {}).get("joins")
    if why is not None:
        rec.update(failed=why, out=out)
    else:
        shutil.rmtree(out, ignore_errors=True)
    return rec


def _report(stdout: str) -> dict | None:
    try:
        rep = json.loads(stdout)
    except ValueError:
        return None
    return rep if isinstance(rep, dict) else None


def _tail(s: str, n: int = 600) -> str:
    s = s.strip()
    return s if len(s) <= n else "..." + s[-n:]


# ------------------------------------------------------------------ failure-free step
def unbroken_step(a: argparse.Namespace, lay: dict, i: int) -> dict:
    out = os.path.join(OUT, f"step-unbroken-{i}")
    cmd = unbroken_cmd(a, out, lay["groups"], 1, lay["redundancy"], STEP_STEPS, "none", 0)
    code, stdout, stderr = run_proc(cmd, RUN_TIMEOUT_S)
    rep = _report(stdout)
    why = f"exit {code}: {_tail(stderr)}" if code != 0 else check_report(rep, STEP_STEPS, 0)
    xs, last = [], []
    for u, evs in group_journals(out).items():
        commits = [e for e in evs if e.get("event") == "commit"]
        xs += step_intervals([float(e["t"]) for e in commits], WARMUP)
        last += [float(e["loss"]) for e in commits if e.get("step") == STEP_STEPS - 1]
    if why is None and not xs:
        why = "no commits in the group journals"
    rec = {"rc": code, "step_s": median(xs), "final_loss": last[0] if last else None}
    if why is not None:
        rec.update(failed=why, out=out)
    else:
        shutil.rmtree(out, ignore_errors=True)
    return rec


def ddp_config(a: argparse.Namespace, lay: dict):
    """The workers' TrainConfig of the step run, as the CLI builds it (the GPT's defaults)."""
    from unbroken.supervise import FTConfig, JobSpec
    from unbroken.supervise.spec import train_config

    gpt, shard = GPT_CUDA if a.device == "cuda" else GPT_CPU
    spec = JobSpec(trainer="gpt", trainer_args=gpt, shard_size=shard, groups=lay["groups"],
                   steps=STEP_STEPS, seed=0, device=a.device,
                   ft=FTConfig(redundancy=lay["redundancy"], spares=0))
    return train_config(spec)


def ddp_step(a: argparse.Namespace, lay: dict, i: int) -> dict:
    world = lay["groups"]
    out = os.path.join(OUT, f"step-ddp-{i}")
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cfg = ddp_config(a, lay).to_json()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--ddp-worker",
                               "--rank", str(k), "--world", str(world), "--port", str(port),
                               "--config", cfg, "--out", out, "--device", a.device],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for k in range(world)]
    why, deadline = None, time.time() + RUN_TIMEOUT_S
    for k, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            why = why or f"rank {k} timed out after {RUN_TIMEOUT_S:.0f} s"
            continue
        if p.returncode != 0 and why is None:
            why = f"rank {k} exit {p.returncode}: {_tail(err)}"
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    xs, last = [], []
    for k in range(world):
        res = journal(os.path.join(out, f"ddp-{k}.jsonl"))
        xs += step_intervals([e["t"] for e in res], WARMUP)
        last += [e["loss"] for e in res if e["step"] == STEP_STEPS - 1]
    if why is None and len(last) != world:
        why = f"{len(last)} of {world} ranks reached the last step"
    rec = {"rc": 0 if why is None else 1, "step_s": median(xs),
           "final_loss": statistics.fmean(last) if len(last) == world else None}
    if why is not None:
        rec.update(failed=why, out=out)
    else:
        shutil.rmtree(out, ignore_errors=True)
    return rec


def ddp_worker(a: argparse.Namespace) -> None:
    """One rank of plain DDP: shard type ``rank`` of every step through the DDP-wrapped model,
    ``backward`` (DDP all-reduces the gradient buckets: the mean over ranks), AdamW. Appends
    {step, loss, t} per step to ``<out>/ddp-<rank>.jsonl``."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from unbroken.runtime.config import TrainConfig
    from unbroken.runtime.trainer import make_trainer

    torch.set_num_threads(1)
    kw = {}
    if a.device == "cuda":  # one GPU a rank, as the runtime's workers
        kw["device_id"] = torch.device("cuda", a.rank)
        torch.cuda.set_device(kw["device_id"])
    cfg = replace(TrainConfig.from_json(a.config), device=str(kw.get("device_id", "cpu")))
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=60), **kw)
    tr = make_trainer(cfg)
    tr.model = DDP(tr.model, device_ids=[a.rank] if a.device == "cuda" else None)
    with open(os.path.join(a.out, f"ddp-{a.rank}.jsonl"), "w", buffering=1) as f:
        for k in range(cfg.steps):
            loss = tr.loss(k, a.rank)  # through the DDP wrapper: its forward, its hooks
            loss.backward()
            tr.opt.step()
            tr.opt.zero_grad(set_to_none=True)
            f.write(json.dumps({"step": k, "loss": float(loss), "t": time.time()}) + "\n")
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ refusal
def refusal(a: argparse.Namespace, n: int) -> dict:
    """``--device cuda`` asking for one process more than there are GPUs: one line, exit 2."""
    out = os.path.join(OUT, "refused")
    g = max(2, n + 1)
    cmd = unbroken_cmd(a, out, g, 1, 2 if g >= 3 else 1, FAULT_STEPS, "none", 0)
    cmd[cmd.index("--device") + 1] = "cuda"  # the check is of --device cuda, whatever --device
    code, _, stderr = run_proc(cmd, 60)
    lines = [s for s in stderr.strip().splitlines() if s.strip()]
    rec = {"groups": g, "rc": code, "line": lines[-1] if lines else ""}
    if code != 2 or len(lines) != 1 or "CUDA devices here" not in lines[0] or \
            os.path.exists(os.path.join(out, "groups")):
        rec["failed"] = f"expected one line and exit 2, got exit {code}: {_tail(stderr)}"
    return rec


# ------------------------------------------------------------------ main
def gpu_info(a: argparse.Namespace) -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "cpus": len(os.sched_getaffinity(0))}
    if a.device == "cuda":
        info["gpu_names"] = [torch.cuda.get_device_name(k)
                             for k in range(torch.cuda.device_count())]
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001 - informational only
            info["nccl"] = f"unknown ({e})"
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="rounds at most (default 3)")
    ap.add_argument("--budget-s", type=float, default=210.0,
                    help="start another round only while it fits in this many seconds")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same plan on gloo, to test this script without GPUs")
    ap.add_argument("--gpus", type=int, default=None,
                    help="with --device cpu: plan as if there were this many GPUs")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--config", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ddp_worker:
        ddp_worker(a)
        return 0
    import torch

    if a.device == "cuda":
        n = torch.cuda.device_count()
        if n == 0:
            print(f"gpu_check: torch {torch.__version__} sees no CUDA device: nothing checked "
                  f"(bench/gpu_check.sh says why)", file=sys.stderr)
            return 1
    else:
        n = a.gpus if a.gpus is not None else 3
    t_start = time.time()
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    p = plan(n)
    log(f"{n} GPU(s) ({a.device}): faults "
        + ", ".join(f"{k}: {v.get('skipped') or 'G=3, spares ' + str(v['spares'])}"
                    for k, v in p["faults"].items())
        + f"; step: {p['step'].get('skipped') or 'G=' + str(p['step']['groups'])}")
    result: dict = {"bench": "gpu_check", "device": a.device, **gpu_info(a), "plan": p,
                    "fault_steps": FAULT_STEPS, "fault_at": FAULT_AT, "step_steps": STEP_STEPS,
                    "warmup": WARMUP,
                    "model": {"gpt": (GPT_CUDA if a.device == "cuda" else GPT_CPU)[0],
                              "shard_size": (GPT_CUDA if a.device == "cuda" else GPT_CPU)[1],
                              "dtype": "float64", "optimizer": "AdamW"}}
    result["refusal"] = refusal(a, n)
    log(f"refusal at G={result['refusal']['groups']}: exit {result['refusal']['rc']}: "
        f"{result['refusal']['line']}")
    # the checks of one round, in order: (name, function of the round index)
    checks: list[tuple[str, object]] = []
    for key, lay in p["faults"].items():
        if "skipped" not in lay:
            for kind in ("kill", "hang"):
                checks.append((f"{kind} {key}",
                               lambda i, lay=lay, kind=kind: fault_run(a, lay, kind, i)))
    if "skipped" not in p["step"]:
        def step_pair(i: int, lay=p["step"]) -> dict:
            order = [("unbroken", unbroken_step), ("ddp", ddp_step)]
            got = {name: fn(a, lay, i) for name, fn in (order if i % 2 == 0 else order[::-1])}
            rec = {"unbroken": got["unbroken"], "ddp": got["ddp"]}
            bad = [f"{k}: {v['failed']}" for k, v in got.items() if "failed" in v]
            if bad:
                rec["failed"] = "; ".join(bad)
            return rec
        checks.append(("step", step_pair))
    runs: dict[str, list[dict]] = {name: [] for name, _ in checks}
    failed: set[str] = set()
    round_s = 0.0
    for i in range(a.repeats):
        if i > 0 and time.time() - t_start + round_s > a.budget_s:
            log(f"round {i}: not started, the next round (~{round_s:.0f} s) would pass "
                f"--budget-s {a.budget_s:.0f}")
            break
        t0 = time.time()
        for name, fn in checks:
            if name in failed:
                continue
            rec = fn(i)
            runs[name].append(rec)
            if "failed" in rec:
                failed.add(name)
            log(f"round {i} {name}: " + json.dumps(rec)[:400])
        round_s = time.time() - t0
    result["rounds"] = max((len(v) for v in runs.values()), default=0)
    faults: dict = {}
    for key, lay in p["faults"].items():
        if "skipped" in lay:
            faults[key] = dict(lay)
            continue
        ent = dict(lay)
        for kind in ("kill", "hang"):
            rs = runs[f"{kind} {key}"]
            ok = [r for r in rs if "failed" not in r]
            ent[f"{kind}_to_commit_s"] = median([r["to_commit_s"] for r in ok])
            ent[f"{kind}_detect_s"] = median([r["detect_s"] for r in ok
                                              if isinstance(r.get("detect_s"), float)])
            ent[f"{kind}_masked"] = all(r.get("masked") for r in ok) if ok else None
            ent[f"{kind}_runs"] = rs
        faults[key] = ent
    result["faults"] = faults
    if "skipped" in p["step"]:
        result["step"] = dict(p["step"])
    else:
        rs = runs["step"]
        ok = [r for r in rs if "failed" not in r]
        ours = [r["unbroken"]["step_s"] for r in ok]
        base = [r["ddp"]["step_s"] for r in ok]
        diffs = [abs(r["unbroken"]["final_loss"] - r["ddp"]["final_loss"]) for r in ok]
        result["step"] = {
            **p["step"], "unbroken_step_s": median(ours), "ddp_step_s": median(base),
            "ratio_median_of_rounds": median([o / b for o, b in zip(ours, base)]),
            "final_loss_diff": max(diffs) if diffs else None, "runs": rs}
        if diffs and max(diffs) > LOSS_TOL:
            failed.add("step")
            result["step"]["failed"] = (f"unbroken and DDP last-step losses differ by "
                                        f"{max(diffs):.3g} (> {LOSS_TOL:g})")
    result["summary"] = {  # the numbers asked for, from the sections above
        **{f"{kind}_to_commit_s": {key: faults[key].get(f"{kind}_to_commit_s")
                                   for key in faults} for kind in ("kill", "hang")},
        **{k: result["step"].get(k) for k in ("unbroken_step_s", "ddp_step_s",
                                              "ratio_median_of_rounds")}}
    if "failed" in result["refusal"]:
        failed.add("refusal")
    result["failed"] = sorted(failed)
    result["ok"] = not failed
    result["wall_s"] = round(time.time() - t_start, 1)
    print(json.dumps(result))
    if failed:
        log(f"FAILED: {', '.join(sorted(failed))} (out dirs of failed runs kept under {OUT})")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
