"""``unbroken demo``: a small GPT trained by stacked data parallelism through real faults.

What it runs
------------
``groups`` worker processes (one data-parallel group each, gloo on CPU) train the byte-level
GPT of :mod:`unbroken.runtime.gpt` on the Python standard library's sources, with redundancy
``r``; ``spares`` warm standby processes wait to replace dead groups. Faults are injected by the
victims themselves at exact steps (``kill``: SIGKILL, ``hang``: SIGSTOP, ``slow``: every
gradient 60 ms slower from then on, ``nan``: one NaN in a gradient, ``flip``: one flipped bit
in every gradient from then on; see :mod:`unbroken.core.faults`); ``xid`` lines and code
``update`` s are written by this launcher when training reaches their step. A seed and a fault
spec give the same run every time; ``--chaos SEED`` draws a spec with every kind
(:func:`unbroken.core.faults.chaos_faults`).

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

from unbroken.core.anomaly import stall_suspected
from unbroken.core.faults import (
    NEED_ACT,
    REMOVING,
    Fault,
    chaos_faults,
    default_faults,
    format_faults,
    parse_faults,
)
from unbroken.core.membership import left_behind
from unbroken.core.placement import check as check_placement
from unbroken.core.standby import refill

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
    standby_p: float | None = None  # size the warm pool as the P99 of Binomial(groups, p)
    out: str = "out/demo"
    staleness: float = 1.0
    heartbeat: float = 0.1
    timeout: float = 600.0
    ckpt_every: int | None = None  # None: 50, or 10 for a chaos run (see ckpt_interval)
    max_restarts: int = 3
    metrics_port: int | None = None  # serve ETTR on Prometheus /metrics (0: any free port)
    xid_log: str | None = None  # kernel-log file watched for GPU XIDs (guard, log-only)
    guard: str = "log"  # "log": detections and ladder decisions journaled only; "act": the
    #                     guard's decisions are carried out (unbroken.guard)
    chaos: int | None = None  # a seeded mix of every fault kind (needs --guard act)
    sdc_every: int | None = None  # None: every ckpt_every steps when the faults hold a flip
    unguarded: bool = False  # bench only: run faults that need an acting guard under log-only,
    #                          to measure what happens without one
    ladder: str | None = None  # ladder policy overrides, "retry=1,time_budget=600" (core.ladder)

    def policy(self):
        """The guard's ladder policy: the defaults at demo scale (a queued update is forced
        after 5 s, not 24 h), then ``ladder``'s overrides."""
        from unbroken.core.ladder import LadderPolicy, parse_policy

        base = LadderPolicy(update_deadline=5.0)
        return parse_policy(self.ladder, base) if self.ladder else base

    def fault_list(self) -> list[Fault]:
        if self.chaos is not None:
            return chaos_faults(self.chaos, self.groups, self.steps)
        if self.faults is None:
            return default_faults(self.groups, self.steps)
        return parse_faults(self.faults, self.groups, self.steps)

    def ckpt_interval(self) -> int:
        """Checkpoint period: ``ckpt_every``, or 10 for a chaos run (its SDC roll-back target,
        so a bit flip costs at most 10 redone steps)."""
        return self.ckpt_every if self.ckpt_every is not None else (
            10 if self.chaos is not None else 50)

    def sdc_interval(self, faults: list[Fault]) -> int:
        """The redundant check's period: the checkpoint interval, so the checkpoint written
        after a passing check is the verified roll-back target."""
        if self.sdc_every is not None:
            return self.sdc_every
        return self.ckpt_interval() if any(f.kind == "flip" for f in faults) else 0


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
    if req.chaos is not None and (req.chaos < 0 or req.faults is not None):
        raise ValueError(f"--chaos {req.chaos}: needs a seed >= 0 and no --faults"
                         if req.chaos < 0 else "--chaos and --faults exclude each other")
    needy = [f for f in req.fault_list() if f.kind in NEED_ACT]
    if needy and req.guard != "act" and not req.unguarded:
        raise ValueError(f"fault {needy[0].spec!r} needs --guard act (a log-only guard cannot "
                         f"end a stall, undo a NaN or corruption, or roll back code)")
    req.policy()  # an impossible ladder budget is bad input, before anything starts
    if req.sdc_every is not None and req.sdc_every < 0:
        raise ValueError(f"--sdc-every {req.sdc_every}: must be >= 0 (0: off)")
    if req.ckpt_interval() < 1:
        raise ValueError(f"--ckpt-every {req.ckpt_every}: must be at least 1")
    if req.spares is not None and req.spares < 0:
        raise ValueError(f"--spares {req.spares}: must be >= 0")
    if req.standby_p is not None:
        if req.spares is not None:
            raise ValueError("--spares and --standby-p exclude each other")
        from unbroken.core.standby import standby_size

        standby_size(req.groups, req.standby_p)  # StandbyError (a ValueError) names p
    if not 0 < req.heartbeat < req.staleness:
        raise ValueError(f"--staleness {req.staleness}: must exceed the heartbeat period "
                         f"{req.heartbeat}")
    return req.fault_list()


def spares_for(req: DemoRequest, faults: list[Fault]) -> int:
    """Warm spares started with the job, one per fault that takes a process away: they import
    and build the model *before* step 0, so on a small machine their start-up does not slow
    training the way a late one does."""
    if req.spares is not None:
        return req.spares
    if req.standby_p is not None:  # byterobust §8: the P99 of Binomial(groups, p)
        from unbroken.core.standby import standby_size

        return standby_size(req.groups, req.standby_p)
    return max(1, sum(1 for f in faults if f.kind in REMOVING or f.kind == "xid"))


def train_config(req: DemoRequest, sdc_every: int = 0):
    from unbroken.runtime.gpt import RECOMMENDED_LR
    from unbroken.runtime.stacked import TrainConfig

    return TrainConfig(groups=req.groups, redundancy=req.redundancy, steps=req.steps,
                       seed=req.seed, model="gpt", dataset_size=8192, shard_size=8,
                       lr=RECOMMENDED_LR, snapshot=True, sdc_every=sdc_every)


#: the code update the demo's ``update`` fault queues: a real shape bug (runtime.updates)
BAD_UPDATE = {"gpt": "unbroken.runtime.updates:bad_gpt", "mlp": "unbroken.runtime.updates:bad_mlp"}


class DemoExit(RuntimeError):
    """The run stopped on purpose with a documented exit code (6: the ladder gave up)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


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
    from unbroken.runtime.stacked import ledger_records

    cfg = train_config(req, req.sdc_interval(faults))
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
    xid_log = req.xid_log
    if xid_log is None and any(f.kind == "xid" for f in faults):
        xid_log = str(out / "kernel.log")  # the injected XID lines go here (dmesg stand-in)
        Path(xid_log).write_text("")
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
                                       "spares": spares, "standby_p": req.standby_p,
                                       "model": cfg.model,
                                       "staleness": req.staleness, "guard": req.guard,
                                       "chaos": req.chaos, "sdc_every": cfg.sdc_every},
          "faults": [{"kind": f.kind, "group": f.group, "step": f.step,
                      **({"code": f.code} if f.code is not None else {})} for f in faults],
          "fault_spec": format_faults(faults)})
    ckdir = out / "ckpt"
    if ckdir.exists():
        shutil.rmtree(ckdir)  # a previous run's checkpoints must not be resumed from
    from unbroken.guard import Guard

    holders: dict[int, int] = {}  # pid -> uid, for XID lines (the supervisor keeps it)
    guard = Guard(emit, standby=spares, xid_log=xid_log, act=req.guard == "act",
                  base_model=cfg.model, uid_of_pid=holders.get,
                  ckpt_every=req.ckpt_interval(), policy=req.policy())
    fired: set[tuple[str, int]] = set()  # (kind, group) of faults already injected
    attempt, done = 0, None
    while done is None:
        pending = [f for f in faults if (f.kind, f.group) not in fired]
        c = _cluster(cfg, jdir, spares, req, ckdir, attempt, pending)
        try:
            done = _Supervisor(c, req, emit, fired, guard, pending, xid_log, holders,
                               restarting=attempt > 0).run()
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


def _cluster(cfg, jdir: Path, spares: int, req: DemoRequest, ckdir: Path, attempt: int,
             pending: list[Fault]):
    """The cluster for one attempt; the victims inject ``pending`` faults (the ones not
    injected by an earlier attempt) themselves."""
    from unbroken.runtime.stacked_worker import StackedCluster

    def by(kind: str) -> dict[int, int]:
        return {f.group: f.step for f in pending if f.kind == kind}

    return StackedCluster(cfg, str(jdir), spares=spares, heartbeat=req.heartbeat,
                          staleness=req.staleness, ckpt_dir=str(ckdir),
                          ckpt_every=req.ckpt_interval(), resume=attempt > 0,
                          die_at=by("kill"), stop_at=by("hang"), slow_from=by("slow"),
                          stall_at=by("stall"), nan_at=by("nan"), flip_from=by("flip"),
                          verdicts=req.guard == "act")


class _Restart(Exception):
    """No replacement can cover a wipe-out: restart every group from the durable checkpoint."""


def _journals(jdir: Path) -> dict[int, list[dict]]:
    out = {}
    for f in sorted(jdir.glob("group-*.jsonl")):
        out[int(f.stem.split("-")[1])] = [json.loads(x) for x in f.read_text().splitlines()
                                         if x.strip()]
    return out


_XID_TEXT = {79: "GPU has fallen off the bus.", 119: "Timeout after 6s of waiting for RPC "
             "response from GPU0 GSP!", 43: "Ch 00000010", 31: "Ch 00000008, intr 10000000. "
             "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000."}


class _Supervisor:
    """One attempt of the job: tails every group's journal, feeds the guard, carries out the
    guard's orders and the launcher's own duties (death notices, spares), until every member
    finished. Raises :class:`_Restart` when a wipe-out cannot get replacements."""

    def __init__(self, c, req: DemoRequest, emit, fired: set, guard, pending: list[Fault],
                 xid_log: str | None, holders: dict[int, int], restarting: bool) -> None:
        self.c, self.req, self.emit, self.fired, self.guard = c, req, emit, fired, guard
        self.restarting, self.xid_log, self.holders = restarting, xid_log, holders
        self.t_decided = time.time()
        self.tails: dict[int, _Tail] = {}
        self.members = set(range(req.groups))   # uids that hold a slot
        self.slot_of = {u: u for u in self.members}
        self.pool = list(c.spares)              # warm spares not yet assigned
        self.next_uid = req.groups + len(c.spares)
        self.finished: dict[int, dict] = {}
        self.handled: set[int] = set()
        self.restarts: set[int] = set()  # generations whose restart was announced
        self.restored = False
        self.seen: set[int] = set()      # uids that have been members of some generation
        self.wiped: dict[int, float] = {}  # step -> first wipe-out event time
        self.top, self.last_step_t = -1, time.time()
        self.launched = [f for f in pending if f.kind in ("xid", "update")]
        for u in self.members | set(self.pool):  # XID lines name the pid of any holder
            holders[c.procs[u].pid] = u

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[int, dict]:
        from unbroken.runtime.ftcomm import declare_dead

        self.declare_dead = declare_dead
        deadline = time.monotonic() + self.req.timeout
        while True:
            for u in list(self.c.uids):
                for ev in self._tail(u).read():
                    self._on_event(u, ev)
            self._launcher_faults()
            self.guard.poll(time.time(), live=self.members - set(self.finished))
            if self.req.guard == "act" and stall_suspected(time.time(), self.last_step_t,
                                                           self.top >= 0):
                self.last_step_t = time.time()  # re-arm: one localisation per stall period
                live = self._live()
                self.guard.localise_stall({u: self.c.procs[u].pid for u in live},
                                          {u: self.slot_of[u] for u in live},
                                          Path(self.c.journal_dir))
            self._orders()
            done = self._exits()
            if done is not None:
                return done
            if time.monotonic() > deadline:
                raise DemoError(f"no finish within {self.req.timeout:.0f}s")
            try:  # wait on a member's exit (an event we care about) rather than a bare sleep
                self.c.procs[min(self.members)].wait(timeout=0.02)
            except subprocess.TimeoutExpired:
                pass

    def _tail(self, u: int) -> _Tail:
        if u not in self.tails:
            tail = self.tails[u] = _Tail(Path(self.c.journal_dir) / f"group-{u}.jsonl")
            if self.restarting:  # skip what the previous incarnation wrote
                tail.pos = tail.path.stat().st_size if tail.path.exists() else 0
        return self.tails[u]

    def _live(self) -> list[int]:
        return sorted(u for u in self.members
                      if u not in self.finished and self.c.procs[u].poll() is None)

    # ------------------------------------------------------------------ journal events
    def _on_event(self, u: int, ev: dict) -> None:
        name, emit = ev.get("event"), self.emit
        if name == "fault":
            self.fired.add((ev["kind"], ev.get("uid", ev["group"])))
        if name == "restore" and self.restarting and not self.restored \
                and ev.get("reason") != "verdict":
            self.restored = True
            emit({"event": "restart", "step": ev["step"], "source": ev["source"],
                  "reason": "wipe-out without replacements", "t": self.t_decided,
                  "t_ready": ev["t"]})
        if name == "wipeout" and not self.pool:
            emit(ev, src=f"group-{u}")
            raise _Restart(f"wipe-out at step {ev['step']} and no spare left: "
                           f"restart from the durable checkpoint")
        if name == "restart":  # one per survivor; the driver's line counts it once
            if ev["gen"] not in self.restarts:
                self.restarts.add(ev["gen"])
                emit({"event": "restart", "step": ev["step"], "source": ev["source"],
                      "reason": "wipe-out", "t_ready": ev["t"],
                      "t": self.wiped.get(ev["step"], ev["reform_at"])})
            ev = {**ev, "event": "restarted"}
        emit(ev, src=f"group-{u}")
        now = time.time()
        if name == "commit":
            self.guard.on_commit(ev, uid=u)
            if ev["step"] > self.top:
                self.top, self.last_step_t = ev["step"], now
        elif name == "incident":
            self.guard.on_incident(ev, now)
        elif name == "replay":
            self.guard.on_replay(ev, now)
        elif name == "sdc_check":
            self.guard.on_check(ev)
        elif name == "health":
            self.guard.on_health(ev, u)
        elif name == "joined":
            emit({"event": "join", "uid": u, "slot": ev["slot"], "step": ev["step"]})
        elif name == "wipeout":
            self.wiped.setdefault(ev["step"], ev["t"])
        if "members" in ev and "gen" in ev:
            self.seen.update(ev["members"])
        if name in ("replan", "wipeout") and "members" in ev:
            # a holder the survivors re-formed without while its process lives: a hang
            for gone in left_behind((self.members & self.seen) - self.handled, ev["members"]):
                if gone not in self.finished and self.c.procs[gone].poll() is None:
                    self._evict(gone, "heartbeat")

    # ------------------------------------------------------------------ faults and orders
    def _launcher_faults(self) -> None:
        """The faults this launcher writes itself once training reaches their step: an XID
        line for the process holding the slot, a queued code update."""
        for f in [f for f in self.launched if f.step <= self.top]:
            self.launched.remove(f)
            now = time.time()
            if f.kind == "update":
                model = BAD_UPDATE.get(self.c.cfg.model, BAD_UPDATE["mlp"])
                self.emit({"event": "fault", "kind": "update", "group": -1, "step": f.step,
                           "version": "v1", "model": model, "t": now})
                self.fired.add(("update", -1))
                self.guard.queue_update("v1", model, now)
                continue
            holder = [u for u in self._live() if self.slot_of[u] == f.group]
            if not holder or self.xid_log is None:
                self.emit({"event": "fault_skipped", "kind": f.kind, "group": f.group,
                           "step": f.step, "reason": "no live holder of the slot"})
                continue
            uid, pid = holder[0], self.c.procs[holder[0]].pid
            bus = f"0000:{f.group + 1:02x}:00"  # demo topology: slot s sits on bus s+1
            line = (f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:{bus}): {f.code}, pid={pid}, "
                    f"name=python, {_XID_TEXT.get(f.code, 'injected')}\n")
            self.emit({"event": "fault", "kind": "xid", "group": f.group, "uid": uid,
                       "step": f.step, "code": f.code, "t": now})
            self.fired.add(("xid", f.group))
            with open(self.xid_log, "a") as log:
                log.write(line)

    def _orders(self) -> None:
        st = self.c.store
        while self.guard.orders:
            order = self.guard.orders.pop(0)
            verb = order[0]
            if verb == "code":
                _, n, rec = order
                st.set(f"code/{n}", json.dumps(rec))
                st.add("code/count", 1)  # rank 0 reads it: every member swaps at one boundary
                self.emit({"event": "code_posted", "n": n, **rec})
            elif verb == "verdict":
                _, key, obj = order
                st.set(key, json.dumps(obj))
                self.emit({"event": "verdict_posted", "key": key, **obj})
            elif verb in ("evict", "respawn"):
                _, gone, how = order
                if gone in self.members and gone not in self.handled \
                        and gone not in self.finished and self.c.procs[gone].poll() is None:
                    self._evict(gone, how, fresh=verb == "respawn")

    def _evict(self, uid: int, how: str, fresh: bool = False) -> None:
        self.c.procs[uid].send_signal(signal.SIGKILL)
        self.c.procs[uid].wait(timeout=10)
        self.declare_dead(self.c.store, uid)
        self._replace(uid, how, fresh=fresh)

    def _replace(self, uid: int, how: str, fresh: bool = False) -> None:
        """The slot of a dead ``uid`` goes to a warm spare, or (``fresh``: retry in place) to a
        new process started for it now."""
        self.handled.add(uid)
        self.members.discard(uid)
        slot = self.slot_of[uid]
        self.emit({"event": "detected", "group": uid, "slot": slot, "how": how})
        if fresh:
            self._spawn()
            spare = self.pool.pop()  # the one just started, not a warm one
        elif self.pool:
            spare = self.pool.pop(0)
        else:
            self.emit({"event": "no_spare", "slot": slot})
            return
        self.slot_of[spare] = slot
        self.members.add(spare)
        self.c.assign(spare, slot)
        self.emit({"event": "assign", "uid": spare, "slot": slot,
                   **({"fresh": True} if fresh else {})})
        for _ in range(refill(len(self.pool))):  # keep one warm for the next fault (its
            self._spawn()                        # start-up takes CPU from training here)

    def _spawn(self) -> None:
        self.c.spawn(self.next_uid, standby=True)
        self.holders[self.c.procs[self.next_uid].pid] = self.next_uid
        self.pool.append(self.next_uid)
        self.next_uid += 1

    # ------------------------------------------------------------------ process exits
    def _exits(self) -> dict[int, dict] | None:
        c = self.c
        for u in sorted(self.members):
            if u in self.finished:
                continue
            if c.store.check([f"done/{u}"]):
                self.finished[u] = json.loads(c.store.get(f"done/{u}"))
                continue
            if c.store.check([f"error/{u}"]):
                raise DemoError(f"group {u} failed:\n{c.store.get(f'error/{u}').decode()}")
            rc = c.procs[u].poll()
            if rc is None or u in self.handled:
                continue
            if rc == -signal.SIGKILL:
                self.declare_dead(c.store, u)  # the launcher saw the exit: no heartbeat wait
                self._replace(u, "exit")
            elif rc == 4:
                raise _Restart(f"group {u} gave up waiting for replacements (exit 4)")
            elif rc == 6:
                raise DemoExit(f"group {u} stopped: the guard's ladder gave up (exit 6)", 6)
            else:
                raise DemoError(f"group {u} exited with code {rc}:\n{c.stderr(u)[-2000:]}")
        if self.members and self.members <= set(self.finished):
            return {u: self.finished[u] for u in sorted(self.members)}
        if not self.members:
            raise _Restart("every group is gone and no spare is left")
        return None


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
