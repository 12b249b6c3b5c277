"""``unbroken demo``: a small GPT trained by stacked data parallelism through real faults.

What it runs
------------
``groups`` worker processes (one data-parallel group each, gloo on CPU) train the byte-level
GPT of :mod:`unbroken.runtime.gpt` on the Python standard library's sources, with redundancy
``r``; ``spares`` warm standby processes wait to replace dead groups. Faults are injected by the
victims themselves at exact steps (``kill``: SIGKILL, ``hang``: SIGSTOP, ``slow``: every
gradient 60 ms slower from then on, a straggler that only the guard reports), so a seed and a
fault spec give the same run every time.

This process is the launcher and the coordinator: it hosts the store, watches the workers,
posts a death notice when a process exits (the fast path for kills), evicts a hung group once
the survivors have re-formed without it (SIGKILL after the fact), sends a warm spare to every
lost slot and starts a new spare to keep the pool full. Masking, re-planning, roll-forward,
wipe-out restarts and the state copy to joiners all happen inside the workers
(:mod:`unbroken.runtime.stacked`); the launcher never decides a plan.

Output: ``<out>/journal.jsonl`` (every event, one JSON object per line, ``src`` = ``driver`` or
``group-<uid>``), ``<out>/demo.png`` (loss with fault markers, ETTR over time), a report
(rich table, or one JSON object with ``--json``) that compares the final parameters with a
failure-free single-process run of the same seed and checks that every sample was consumed
exactly once.

If this process dies the job dies with it (it hosts the store): see the README's
"Coordinator failure" section.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from unbroken.core.faults import Fault, default_faults, format_faults, parse_faults
from unbroken.core.placement import check as check_placement

__all__ = ["DemoRequest", "DemoError", "check", "run_demo"]


class DemoError(RuntimeError):
    """The run could not finish (a worker error, no survivor, a timeout)."""


@dataclass(frozen=True)
class DemoRequest:
    groups: int = 4
    redundancy: int = 2
    steps: int = 200
    seed: int = 0
    faults: str | None = None  # None: the default schedule for this size
    spares: int | None = None  # None: one warm spare per scheduled fault (at least one)
    out: str = "out/demo"
    staleness: float = 1.0
    heartbeat: float = 0.1
    timeout: float = 600.0
    ckpt_every: int = 50
    max_restarts: int = 3
    metrics_port: int | None = None  # serve ETTR on Prometheus /metrics (0: any free port)
    xid_log: str | None = None  # kernel-log file watched for GPU XIDs (guard, log-only)
    guard: str = "log"  # "log": detections and ladder decisions journaled only; "act": evict
    #                     a straggler the ladder would mask/evict

    def fault_list(self) -> list[Fault]:
        if self.faults is None:
            return default_faults(self.groups, self.steps)
        return parse_faults(self.faults, self.groups, self.steps)


def check(req: DemoRequest) -> list[Fault]:
    """Validate before anything starts; raises ValueError (one line naming the value)."""
    if req.groups < 2:
        raise ValueError(f"--groups {req.groups}: stacked data parallelism needs at least 2 "
                         f"groups")
    if req.redundancy < 1:
        raise ValueError(f"--redundancy {req.redundancy}: must be at least 1")
    check_placement(req.groups, req.redundancy)
    if req.steps < 2:
        raise ValueError(f"--steps {req.steps}: need at least 2 steps")
    if req.guard not in ("log", "act"):
        raise ValueError(f"--guard {req.guard!r}: expected 'log' or 'act'")
    stalls = [f for f in req.fault_list() if f.kind == "stall"]
    if stalls and req.guard != "act":
        raise ValueError(f"fault 'stall:{stalls[0].group}@{stalls[0].step}' needs --guard act "
                         f"(a log-only guard cannot end a stall)")
    if req.ckpt_every < 1:
        raise ValueError(f"--ckpt-every {req.ckpt_every}: must be at least 1")
    if req.spares is not None and req.spares < 0:
        raise ValueError(f"--spares {req.spares}: must be >= 0")
    if not 0 < req.heartbeat < req.staleness:
        raise ValueError(f"--staleness {req.staleness}: must exceed the heartbeat period "
                         f"{req.heartbeat}")
    return req.fault_list()


def spares_for(req: DemoRequest, faults: list[Fault]) -> int:
    """Warm spares started with the job: they import and build the model *before* step 0, so
    on a small machine their start-up does not slow training the way a late one does."""
    return req.spares if req.spares is not None else max(1, len(faults))


def train_config(req: DemoRequest):
    from unbroken.runtime.gpt import RECOMMENDED_LR
    from unbroken.runtime.stacked import TrainConfig

    return TrainConfig(groups=req.groups, redundancy=req.redundancy, steps=req.steps,
                       seed=req.seed, model="gpt", dataset_size=8192, shard_size=8,
                       lr=RECOMMENDED_LR, snapshot=True)


class _Tail:
    """Reads the complete lines appended to a group's journal since the last call."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.rest = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        data, self.rest = self.rest + data, b""
        lines = data.split(b"\n")
        self.rest = lines.pop()  # an incomplete last line waits for its newline
        return [json.loads(x) for x in lines if x.strip()]


def run_demo(req: DemoRequest, *, emit_line: Callable[[str], None] | None = None,
             view: Any = None) -> dict:
    """Run the demo; returns the report (see :func:`unbroken.demo_report.build_report`)."""
    faults = check(req)
    import torch

    from unbroken.core.shards import exactly_once
    from unbroken.demo_report import build_report, plot_demo
    from unbroken.runtime.ftcomm import declare_dead
    from unbroken.runtime.stacked import ledger_records
    from unbroken.runtime.stacked_worker import StackedCluster

    cfg = train_config(req)
    exporter = None
    if req.metrics_port is not None:  # bind first: a bad port fails before anything starts
        from unbroken.metrics import MetricsExporter

        exporter = MetricsExporter(req.metrics_port)
        if emit_line is not None:
            emit_line(f"metrics on http://127.0.0.1:{exporter.port}/metrics")
    out = Path(req.out)
    out.mkdir(parents=True, exist_ok=True)
    jdir = out / "groups"
    jdir.mkdir(exist_ok=True)
    for f in jdir.glob("group-*.jsonl"):
        f.unlink()  # journals append; a previous run's lines must not mix in
    events: list[dict] = []
    merged = open(out / "journal.jsonl", "w", buffering=1)
    last_export = [0.0]

    def emit(ev: dict, src: str = "driver") -> None:
        ev = {**ev, "src": src}
        ev.setdefault("t", time.time())
        events.append(ev)
        merged.write(json.dumps(ev) + "\n")
        line = view.update(ev) if view is not None else None
        if line and emit_line is not None:
            emit_line(line)
        if exporter is not None and time.monotonic() - last_export[0] > 0.5:
            last_export[0] = time.monotonic()  # the report is O(journal): refresh at 2 Hz
            exporter.update(events)

    t_start = time.time()
    spares = spares_for(req, faults)
    emit({"event": "start", "config": {"groups": req.groups, "redundancy": req.redundancy,
                                       "steps": req.steps, "seed": req.seed,
                                       "spares": spares, "model": cfg.model,
                                       "staleness": req.staleness},
          "faults": [{"kind": f.kind, "group": f.group, "step": f.step} for f in faults],
          "fault_spec": format_faults(faults)})
    ckdir = out / "ckpt"
    if ckdir.exists():
        shutil.rmtree(ckdir)  # a previous run's checkpoints must not be resumed from
    from unbroken.guard import Guard

    guard = Guard(emit, standby=spares, xid_log=req.xid_log, act=req.guard == "act")
    fired: set[tuple[str, int]] = set()  # (kind, slot) of faults already injected
    attempt, done = 0, None
    while done is None:
        pending = [f for f in faults if (f.kind, f.group) not in fired]
        c = StackedCluster(cfg, str(jdir), spares=spares, heartbeat=req.heartbeat,
                           staleness=req.staleness, ckpt_dir=str(ckdir),
                           ckpt_every=req.ckpt_every, resume=attempt > 0,
                           die_at={f.group: f.step for f in pending if f.kind == "kill"},
                           stop_at={f.group: f.step for f in pending if f.kind == "hang"},
                           slow_from={f.group: f.step for f in pending if f.kind == "slow"},
                           stall_at={f.group: f.step for f in pending if f.kind == "stall"})
        try:
            done = _supervise(c, req, emit, declare_dead, fired, guard,
                              restarting=attempt > 0)
        except _Restart as r:
            attempt += 1
            if attempt > req.max_restarts:
                raise DemoError(f"{r}; gave up after {req.max_restarts} restarts") from None
            emit({"event": "restart_requested", "reason": str(r), "attempt": attempt})
        finally:
            c.close()
    journals = _journals(jdir)
    wall = time.time() - t_start
    emit({"event": "end", "wall_s": wall})
    merged.close()

    ref = _reference(cfg, out)
    diffs = [(torch.tensor(d["params"], dtype=torch.float64) - ref).abs().max().item()
             for d in done.values()]
    rep = exactly_once(ledger_records(journals), cfg.steps, cfg.groups)
    report = build_report(events, max_abs_param_diff=max(diffs), exactly_once=rep.ok,
                          ledger={"records": rep.records, "missing": len(rep.missing),
                                  "duplicated": len(rep.duplicated), "stray": len(rep.stray)})
    report["wall_s"] = wall
    report["journal"] = str(out / "journal.jsonl")
    if exporter is not None:
        exporter.update(events)
        report["metrics_port"] = exporter.port
        exporter.close()
    report["png"] = str(plot_demo(events, out / "demo.png"))
    return report


# no new step for this long while nobody is being re-formed: a stall heartbeats cannot see
# (a hang is found by staleness in 1 s and masked within 2 s; a wipe-out waiting for a cold
# spare shows every survivor in the same wait, which localisation leaves alone)
STALL_S = 3.0


class _Restart(Exception):
    """No replacement can cover a wipe-out: restart every group from the durable checkpoint."""


def _journals(jdir: Path) -> dict[int, list[dict]]:
    out = {}
    for f in sorted(jdir.glob("group-*.jsonl")):
        out[int(f.stem.split("-")[1])] = [json.loads(x) for x in f.read_text().splitlines()
                                         if x.strip()]
    return out


def _supervise(c, req: DemoRequest, emit, declare_dead, fired: set, guard,
               restarting: bool = False) -> dict[int, dict]:
    """Watch processes and journals until every member finished; returns their ``done``.
    Raises :class:`_Restart` when a wipe-out cannot get replacements."""
    t_decided = time.time()
    tails = {}
    members = set(range(req.groups))   # uids that hold a slot
    slot_of = {u: u for u in members}
    pool = list(c.spares)              # warm spares not yet assigned
    next_uid = req.groups + len(c.spares)
    finished: dict[int, dict] = {}
    handled: set[int] = set()
    restarts: set[int] = set()  # generations whose restart was announced
    restarts_src: set[str] = set()
    seen: set[int] = set()      # uids that have been members of some generation
    wiped: dict[int, float] = {}  # step -> first wipe-out event time
    top_step, last_step_t = [-1], [time.time()]  # newest committed step and when it came
    deadline = time.monotonic() + req.timeout

    def replace(uid: int, how: str) -> None:
        nonlocal next_uid
        handled.add(uid)
        members.discard(uid)
        emit({"event": "detected", "group": uid, "slot": slot_of[uid], "how": how})
        if not pool:
            emit({"event": "no_spare", "slot": slot_of[uid]})
            return
        spare = pool.pop(0)
        slot_of[spare] = slot_of[uid]
        members.add(spare)
        c.assign(spare, slot_of[uid])
        emit({"event": "assign", "uid": spare, "slot": slot_of[uid]})
        if not pool:  # the warm pool is used up: start one more so a later fault is covered
            c.spawn(next_uid, standby=True)  # (its start-up takes CPU from training here)
            pool.append(next_uid)
            next_uid += 1

    while True:
        for u in list(c.uids):
            if u not in tails:
                tail = tails[u] = _Tail(Path(c.journal_dir) / f"group-{u}.jsonl")
                if restarting:  # skip what the previous incarnation wrote
                    tail.pos = tail.path.stat().st_size if tail.path.exists() else 0
            for ev in tails[u].read():
                name = ev.get("event")
                if name == "fault":
                    fired.add((ev["kind"], ev["group"]))
                if name == "restore" and restarting and "restore" not in restarts_src:
                    restarts_src.add("restore")
                    emit({"event": "restart", "step": ev["step"], "source": ev["source"],
                          "reason": "wipe-out without replacements", "t": t_decided,
                          "t_ready": ev["t"]})
                if name == "wipeout" and not pool:
                    emit(ev, src=f"group-{u}")
                    raise _Restart(f"wipe-out at step {ev['step']} and no spare left: "
                                   f"restart from the durable checkpoint")
                if name == "restart":  # one per survivor; the driver's line counts it once
                    if ev["gen"] not in restarts:
                        restarts.add(ev["gen"])
                        emit({"event": "restart", "step": ev["step"], "source": ev["source"],
                              "reason": "wipe-out", "t_ready": ev["t"],
                              "t": wiped.get(ev["step"], ev["reform_at"])})
                    ev = {**ev, "event": "restarted"}
                emit(ev, src=f"group-{u}")
                if name == "commit":
                    guard.on_commit(ev, uid=u)
                    if ev["step"] > top_step[0]:
                        top_step[0], last_step_t[0] = ev["step"], time.time()
                if name == "joined":
                    emit({"event": "join", "uid": u, "slot": ev["slot"], "step": ev["step"]})
                if name == "wipeout":
                    wiped.setdefault(ev["step"], ev["t"])
                if "members" in ev and "gen" in ev:
                    seen.update(ev["members"])
                if name in ("replan", "wipeout") and "members" in ev:
                    # a former member the survivors re-formed without while its process lives:
                    # a hang (spares not yet admitted were never members, so never evicted)
                    for gone in sorted((members & seen) - set(ev["members"]) - handled):
                        if gone in finished or c.procs[gone].poll() is not None:
                            continue
                        c.procs[gone].send_signal(signal.SIGKILL)
                        c.procs[gone].wait(timeout=10)
                        declare_dead(c.store, gone)
                        replace(gone, "heartbeat")
        guard.poll(time.time())
        if req.guard == "act" and top_step[0] >= 0 and time.time() - last_step_t[0] > STALL_S:
            last_step_t[0] = time.time()  # re-arm: one localisation per stall period
            live = sorted(u for u in members if u not in finished and c.procs[u].poll() is None)
            guard.localise_stall({u: c.procs[u].pid for u in live},
                                 {u: slot_of[u] for u in live}, Path(c.journal_dir))
        while guard.evictions:  # acting guard: evict a straggler like a hung group
            gone, how = guard.evictions.pop(0)
            if gone in members and gone not in handled and gone not in finished \
                    and c.procs[gone].poll() is None:
                c.procs[gone].send_signal(signal.SIGKILL)
                c.procs[gone].wait(timeout=10)
                declare_dead(c.store, gone)
                replace(gone, how)
        for u in sorted(members):
            if u in finished:
                continue
            if c.store.check([f"done/{u}"]):
                finished[u] = json.loads(c.store.get(f"done/{u}"))
                continue
            if c.store.check([f"error/{u}"]):
                raise DemoError(f"group {u} failed:\n{c.store.get(f'error/{u}').decode()}")
            rc = c.procs[u].poll()
            if rc is None or u in handled:
                continue
            if rc == -signal.SIGKILL:
                declare_dead(c.store, u)  # the launcher saw the exit: no heartbeat wait
                replace(u, "exit")
            elif rc == 4:
                raise _Restart(f"group {u} gave up waiting for replacements (exit 4)")
            else:
                raise DemoError(f"group {u} exited with code {rc}:\n{c.stderr(u)[-2000:]}")
        if members and members <= set(finished):
            return {u: finished[u] for u in sorted(members)}
        if not members:
            raise _Restart("every group is gone and no spare is left")
        if time.monotonic() > deadline:
            raise DemoError(f"no finish within {req.timeout:.0f}s")
        try:  # wait on a member's exit (an event we care about) rather than a bare sleep
            c.procs[min(members)].wait(timeout=0.02)
        except subprocess.TimeoutExpired:
            pass


def _reference(cfg, out: Path):
    """Failure-free single-process run of the same seed (cached by config)."""
    import torch

    from unbroken.runtime.stacked import reference_run

    key = hashlib.sha256(cfg.to_json().encode()).hexdigest()[:16]
    path = out / f"reference-{key}.pt"
    if path.exists():
        try:
            return torch.load(path)
        except Exception:
            path.unlink()  # a damaged cache is recomputed, never trusted
    ref = reference_run(cfg)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    torch.save(ref, tmp)
    os.replace(tmp, path)
    return ref
