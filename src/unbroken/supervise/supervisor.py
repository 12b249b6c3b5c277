"""The supervisor: launches a job's workers and warm spares, watches them, carries out the guard.

What it owns (and nothing else): the processes. It starts one worker per data-parallel group
and a pool of warm spares, hosts the store in a child process of its own, posts a death
notice the moment a worker exits (the fast path for kills), evicts a member the survivors
re-formed without, sends a spare to every lost slot and keeps the pool full, carries out the
guard's orders (evict, respawn, code records, verdicts), and restarts the job from the durable
checkpoint when a wipe-out cannot be covered. Masking, re-planning, roll-forward, state copies
and in-place restores happen inside the workers (:mod:`unbroken.runtime.stacked`); the
supervisor never decides a plan, and the guard (:mod:`unbroken.guard`) decides every ladder
rung.

Failure semantics (each tested in ``tests/supervise``):

* **Supervisor stopped** (SIGSTOP, a wedged host): it beats ``hb/supervisor`` from a thread of
  its own; members that see it silent for ``supervisor_staleness`` s stop after the same
  committed step, rank 0 writes a checkpoint, and they exit 5. The store lives in a separate
  process, so that stop is coordinated. A continued supervisor reports exit 5;
  ``--resume`` continues.
* **Supervisor killed**: its store host dies with it (``PR_SET_PDEATHSIG``); members stop as
  above (exit 5). Workers still starting up die with it within a second.
* **Ctrl-C / SIGTERM**: ``ctl/stop`` is set; rank 0 reads it into the step buffer, every member
  stops after the same committed step, rank 0 writes a checkpoint, they exit 8, the spares are
  killed and :meth:`Supervisor.run` returns exit 130 / 143 with one line naming the checkpoint.
  A second signal kills everything at once. Workers sit in their own session, so a terminal's
  Ctrl-C does not reach them.

Latency budget at the default settings: a kill is noticed from the exit (~0.1 s), a hang from
heartbeats (``staleness``, 0.3 s, once the peers beat three times meanwhile: a starved machine
waits longer, ``core.membership``), a silent supervisor in ``supervisor_staleness`` (5 s).
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from unbroken.core.actions import (
    Evict,
    PostCode,
    PostVerdict,
    Quarantine,
    Replace,
    Respawn,
    RestartJob,
    StopJob,
)
from unbroken.core.anomaly import stall_suspected
from unbroken.core.faults import Fault, format_faults, holder_faults
from unbroken.core.membership import left_behind
from unbroken.core.placement import make_layout, uncovered, wiped_out
from unbroken.core.standby import refill
from unbroken import spawn
from unbroken.events import Event
from unbroken.fsio import copy_atomic, sha256_file
from unbroken.procwait import ExitWaiter
from unbroken.protocol import (CODE_COUNT, STOP_KEY, SUPERVISOR_HB, ExitCode, code_key, done_key,
                               error_key)
from unbroken.supervise.drill import LauncherDrill
from unbroken.supervise.nodes import job_nodes
from unbroken.supervise.outdir import prepare, read_journal, repair_journals
from unbroken.supervise.spec import JobSpec, check, load_trainer, spares_for, train_config

__all__ = ["Supervisor", "RunResult", "RunError"]


class RunError(RuntimeError):
    """The run could not finish (a worker error, no survivor, a timeout): exit 1."""


@dataclass
class RunResult:
    """What :meth:`Supervisor.run` returns: the exit code, one line when it is not 0, the
    report (``unbroken.demo_report.build_report`` keys) and every finisher's final params."""

    code: ExitCode
    message: str | None
    report: dict
    params: dict[int, list] = field(default_factory=dict)
    checkpoint: str | None = None

    @property
    def ok(self) -> bool:
        return self.code == ExitCode.OK


class _Restart(Exception):
    """The ladder decided to restart every group from the durable checkpoint (after
    ``backoff`` seconds)."""

    def __init__(self, reason: str, backoff: float = 0.0) -> None:
        super().__init__(reason)
        self.backoff = backoff


class _Ended(Exception):
    """Every member stopped on purpose (a stop request, a silent supervisor, the ladder)."""

    def __init__(self, code: ExitCode, message: str, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.code, self.checkpoint = code, checkpoint


class _Tail:
    """Reads the complete lines appended to a group's journal since the last call.

    The file stays open once it exists: the loop reads every journal 20 times a second, and an
    open, seek and close per read were most of the supervisor's CPU between events (the
    journals are only ever appended to, so an open file sees what is written after it)."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.rest = path, 0, b""
        self._f = None

    def read(self) -> list[dict]:
        if self._f is None:
            try:
                self._f = open(self.path, "rb")
            except FileNotFoundError:
                return []
            self._f.seek(self.pos)
        data = self._f.read()
        self.pos += len(data)
        data, self.rest = self.rest + data, b""
        lines = data.split(b"\n")
        self.rest = lines.pop()  # an incomplete last line waits for its newline
        out = []
        for x in lines:
            if x.strip():
                try:
                    out.append(json.loads(x))
                except ValueError:  # a line a killed writer left half-written
                    out.append({"event": Event.JOURNAL_DAMAGED, "file": str(self.path)})
        return out

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class Supervisor:
    """Runs one :class:`JobSpec` to the end; ``emit_line`` gets one line per notable event
    (from ``view.update``), ``view`` (optional) renders the journal live."""

    def __init__(self, spec: JobSpec, *, emit_line: Callable[[str], None] | None = None,
                 view: Any = None, figure: str = "run.png") -> None:
        self.spec, self.emit_line, self.view, self.figure = spec, emit_line, view, figure
        self.events: list[dict] = []
        self._signal: int | None = None

    # ------------------------------------------------------------------ public
    def check(self):
        """Validate the spec and build the trainer once (bad input raises ValueError)."""
        faults = check(self.spec)
        cfg = train_config(self.spec, self.spec.sdc_interval(faults))
        spawn.warm()  # the workers' fork server imports torch while the trainer is built here
        load_trainer(cfg)
        return faults, cfg

    def run(self) -> RunResult:
        spec = self.spec
        faults, cfg = self.check()
        out = Path(spec.out)
        exporter = None
        if spec.ft.metrics_port is not None:  # bind first: a bad port fails before anything runs
            from unbroken.metrics import MetricsExporter

            exporter = MetricsExporter(spec.ft.metrics_port)
        try:
            found = prepare(out, resume=spec.resume, fresh=spec.fresh)
        except BaseException:
            if exporter is not None:
                exporter.close()
            raise
        if exporter is not None:
            self._line(f"metrics on http://127.0.0.1:{exporter.port}/metrics")
        if found["kept_in"]:
            self._line(f"the previous run in {out} was moved to {found['kept_in']}")
        repaired = repair_journals(out) if spec.resume else []
        if cfg.selector is not None:  # --nodes: every node reads --out, not this machine's disk
            cfg = replace(cfg, selector=copy_atomic(cfg.selector, out / "selector.pt"))
        jdir = out / "groups"
        jdir.mkdir(exist_ok=True)
        xid_log = spec.ft.xid_log
        if xid_log is None and any(f.kind == "xid" for f in faults):
            xid_log = str(out / "kernel.log")  # the drill's XID lines go here (dmesg stand-in)
            Path(xid_log).touch()
        self._merged = open(out / "journal.jsonl", "a" if spec.resume else "w", buffering=1)
        self._exporter, self._last_export = exporter, 0.0
        old = self._install_signals()
        try:
            return self._run(faults, cfg, out, jdir, xid_log, found, repaired)
        finally:
            self._restore_signals(old)
            self._merged.close()
            if exporter is not None:
                exporter.update(self.events)
                exporter.close()

    # ------------------------------------------------------------------ internals
    def _line(self, text: str) -> None:
        if self.emit_line is not None:
            self.emit_line(text)

    def emit(self, ev: dict, src: str = "driver") -> None:
        ev = {**ev, "src": src}
        ev.setdefault("t", time.time())
        self.events.append(ev)
        self._merged.write(json.dumps(ev) + "\n")
        line = self.view.update(ev) if self.view is not None else None
        if line:
            self._line(line)
        if self._exporter is not None and time.monotonic() - self._last_export > 0.5:
            self._last_export = time.monotonic()  # the report is O(journal): refresh at 2 Hz
            self._exporter.update(self.events)

    def _backoff(self, seconds: float) -> _Ended | None:
        """Wait a requeue's backoff; a signal meanwhile ends the run (the checkpoint is on
        disk already: nothing is running)."""
        deadline = time.monotonic() + seconds
        while True:  # a signal before the next attempt starts ends the run, backoff or not
            if self._signal is not None:
                sig = signal.Signals(self._signal)
                code = ExitCode.INTERRUPTED if sig == signal.SIGINT else ExitCode.TERMINATED
                return _Ended(code, f"stopped on {sig.name} while waiting to restart; "
                                    f"--resume continues from the last checkpoint")
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum, _frame):
            if self._signal is not None:  # the second one: no more waiting
                raise KeyboardInterrupt
            self._signal = signum

        return {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signals(old: dict) -> None:
        for s, h in old.items():
            signal.signal(s, h)

    def _run(self, faults, cfg, out: Path, jdir: Path, xid_log, found, repaired) -> RunResult:
        from unbroken.guard import Guard

        spec = self.spec
        t_start = time.time()
        spares = spares_for(spec, faults)
        self.emit({"event": Event.START, "config": {
            "groups": spec.groups, "redundancy": spec.ft.redundancy, "steps": spec.steps,
            "seed": spec.seed, "spares": spares, "standby_p": spec.ft.standby_p,
            "model": cfg.model, "trainer_args": spec.trainer_args,
            "staleness": spec.ft.staleness, "guard": spec.ft.guard, "chaos": spec.chaos,
            "sdc_every": cfg.sdc_every, "resume": spec.resume, "stragglers": cfg.stragglers,
            "sync": cfg.sync, "resume_step": found["resume_step"],
            **({"selector": spec.selector, "selector_sha256": sha256_file(cfg.selector)}
               if cfg.selector else {})},
            "faults": [{"kind": f.kind, "group": f.group, "step": f.step,
                        **({"code": f.code} if f.code is not None else {})} for f in faults],
            "fault_spec": format_faults(faults)})
        for path in repaired:
            self.emit({"event": Event.JOURNAL_REPAIRED, "file": path,
                       "reason": "a last line cut off mid-write was removed"})
        holders: dict[int, int] = {}  # pid -> uid, for XID lines
        guard = Guard(self.emit, xid_log=xid_log, act=spec.ft.guard == "act",
                      base_model=cfg.model, uid_of_pid=holders.get,
                      ckpt_every=spec.ckpt_interval(), policy=spec.ft.policy())
        from unbroken.nodes.directory import NodeStartError

        try:
            with job_nodes(spec, self._line) as directory:  # node agents: one for the job's life
                done, ended = self._attempts(faults, cfg, out, jdir, xid_log, spares, guard,
                                             holders, directory)
        except NodeStartError as e:  # the agents did not come: the run cannot start
            raise RunError(str(e).splitlines()[0]) from None
        return self._finish(done, ended, cfg, out, jdir, t_start)

    def _attempts(self, faults, cfg, out: Path, jdir: Path, xid_log, spares: int, guard,
                  holders: dict, directory) -> tuple[dict | None, _Ended | None]:
        """Attempts of the job until one finishes or the job ends: (done, ended)."""
        spec = self.spec
        fired: set[Fault] = set()  # the schedule's faults that fired (kind, slot, step named)
        attempt, done, ended, backoff = 0, None, None, 0.0
        while done is None and ended is None:
            pending = [f for f in faults if f not in fired]
            if attempt > 0 and directory is not None:  # agents that died during the backoff
                for k, why in directory.fence_silent(3 * spec.ft.node_staleness).items():
                    self.emit({"event": Event.NODE_LOST, "node": k, "reason": why, "uids": []})
            c = _cluster(cfg, jdir, spares, spec, out / "ckpt",
                         resume=attempt > 0 or spec.resume, pending=pending,
                         directory=directory)
            # ten beats per window the members judge it by: faster is store traffic that
            # tells them nothing more
            beat = _Heartbeat(c.store, max(spec.ft.heartbeat,
                                           spec.ft.supervisor_staleness / 10))
            guard.new_attempt()
            try:
                done = _Attempt(self, c, fired, guard, pending, xid_log, holders,
                                restarting=attempt > 0, skip_old=attempt > 0 or spec.resume
                                ).run()
            except _Restart as r:  # the ladder's budget bounds these (core.ladder)
                attempt, backoff = attempt + 1, r.backoff
                self.emit({"event": Event.RESTART_REQUESTED, "reason": str(r), "attempt": attempt,
                           "backoff_s": r.backoff})
            except _Ended as e:
                ended = e
            finally:
                beat.stop()
                c.close()
            if ended is None and done is None:
                ended = self._backoff(backoff)
        return done, ended

    def _finish(self, done, ended, cfg, out: Path, jdir: Path, t_start: float) -> RunResult:
        from unbroken.demo_report import build_report, straggler_report
        from unbroken.core.ledger import check_ledger

        spec = self.spec
        journals = {int(f.stem.split("-")[1]): read_journal(f)
                    for f in sorted(jdir.glob("group-*.jsonl"))}
        wall = time.time() - t_start
        steps = spec.steps if ended is None else None
        orphans: list[tuple[int, int]] = []
        rep, bad_ledger = check_ledger(journals, steps or _committed(journals), cfg.groups,
                                       orphans)
        for k in sorted({k for k, _g in orphans}):  # a partition: say what the ledger dropped
            who = sorted({g for s, g in orphans if s == k})
            self._line(f"step {k}: group(s) {who} committed it alone as they were cut off; "
                       f"the survivors' re-plan of it counts (core.ledger)")
        if bad_ledger is not None and ended is None:  # the journal's END says how it ended
            ended = _Ended(ExitCode.FAILED, bad_ledger)
        self.emit({"event": Event.END, "wall_s": wall,
                   **({"code": int(ended.code), "reason": str(ended)} if ended else {})})
        report = build_report(self.events, max_abs_param_diff=None, exactly_once=rep.ok,
                              ledger=None if bad_ledger else {
                                  "records": rep.records, "missing": len(rep.missing),
                                  "duplicated": len(rep.duplicated), "stray": len(rep.stray)})
        report["faults_detected"] = sum(1 for f in report["time_lost_per_fault"]
                                        if f["detect_s"] is not None)
        report.update(straggler_report(self.events, t_start, spec.target_loss))
        report["wall_s"] = wall
        report["journal"] = str(out / "journal.jsonl")
        if self._exporter is not None:
            report["metrics_port"] = self._exporter.port
        from unbroken.demo_report import plot_demo

        report["png"] = str(plot_demo(self.events, out / self.figure))
        if orphans:
            report["orphan_commits"] = [{"step": k, "group": g} for k, g in sorted(orphans)]
        if bad_ledger is not None:
            report["exactly_once"], report["ledger_error"] = False, bad_ledger
        if ended is not None:
            report["stopped"] = {"code": int(ended.code), "reason": str(ended),
                                 "checkpoint": ended.checkpoint}
            return RunResult(ended.code, str(ended), report, checkpoint=ended.checkpoint)
        return RunResult(ExitCode.OK, None, report, params={u: d["params"]
                                                            for u, d in done.items()})


def _committed(journals: dict[int, list[dict]]) -> int:
    """Steps committed so far (the ledger's extent when a run stopped early)."""
    top = -1
    for evs in journals.values():
        for e in evs:
            if e.get("event") == Event.COMMIT:
                top = max(top, int(e["step"]))
            elif e.get("event") == Event.RESTORE:
                top = max(-1, min(top, int(e["step"]) - 1))
    return top + 1


class _Heartbeat:
    """The supervisor's own heartbeat, from a thread with its own store client: it stops when
    the whole process is stopped, which is exactly what the members must notice."""

    def __init__(self, store, period: float) -> None:
        self._stop = threading.Event()
        st = store.clone()
        st.add(SUPERVISOR_HB, 1)

        def beat() -> None:
            while not self._stop.wait(period):
                try:
                    st.add(SUPERVISOR_HB, 1)
                except Exception:
                    return  # the store host is gone: the members see that themselves
        self._thread = threading.Thread(target=beat, name="supervisor-hb", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def _cluster(cfg, jdir: Path, spares: int, spec: JobSpec, ckdir: Path, *, resume: bool,
             pending: list[Fault], directory=None):
    """The cluster for one attempt; the victims inject ``pending`` faults (the ones not
    injected by an earlier attempt) themselves, each process its slot's share
    (``core.faults.holder_faults``; a spare gets its share when assigned)."""
    from unbroken.runtime.stacked_worker import StackedCluster

    drill = {g: holder_faults(pending, g) for g in range(cfg.groups)}
    kw = dict(spares=spares, heartbeat=spec.ft.heartbeat,
              staleness=spec.ft.staleness, ckpt_dir=str(ckdir),
              ckpt_every=spec.ckpt_interval(), resume=resume,
              drill={g: [(f.kind, f.step) for f in fs] for g, fs in drill.items() if fs},
              verdicts=spec.ft.guard == "act", store_process=True,
              supervisor_staleness=spec.ft.supervisor_staleness)
    if directory is not None:  # the same surface, the workers under node agents
        from unbroken.core.nodes import on_live_nodes
        from unbroken.nodes.cluster import NodeCluster

        # a restart places the groups on the nodes still live (a lost one stays fenced)
        node_of, _warning = on_live_nodes(cfg.groups, spec.ft.redundancy, directory.live())
        return NodeCluster(cfg, str(jdir), directory=directory, node_of=node_of,
                           out=str(Path(spec.out).resolve()),
                           node_staleness=spec.ft.node_staleness, **kw)
    return StackedCluster(cfg, str(jdir), **kw)


class _Attempt:
    """One attempt of the job: tails every group's journal, feeds the guard, carries out the
    guard's orders and the launcher's own duties (death notices, spares), until every member
    finished. Raises :class:`_Restart` when a wipe-out cannot get replacements, :class:`_Ended`
    when the members stopped on purpose."""

    #: the loop's period when no process exits: journal lines and the guard's clock (a death
    #: wakes it at once). The guard works in seconds; 50 ms is far inside its budget.
    TICK_S = 0.05

    def __init__(self, sup: Supervisor, c, fired: set, guard, pending: list[Fault],
                 xid_log: str | None, holders: dict[int, int], restarting: bool,
                 skip_old: bool) -> None:
        self.sup, self.c, self.spec, self.emit = sup, c, sup.spec, sup.emit
        self.fired, self.guard, self.holders = fired, guard, holders
        self.pending = pending
        self.victims: set[int] = set()  # uids a scheduled fault hit (not real failures)
        self.restarting, self.skip_old = restarting, skip_old
        self.t_decided = time.time()
        self.tails: dict[int, _Tail] = {}
        self.members = set(range(self.spec.groups))   # uids that hold a slot
        self.joined = set(self.members)               # ... and have trained in it
        self.slot_of = {u: u for u in self.members}
        self.pool = list(c.spares)                    # warm spares not yet assigned
        self.next_uid = self.spec.groups + len(c.spares)
        self.finished: dict[int, dict] = {}
        self.stopped: dict[int, int] = {}             # uid -> its on-purpose exit code
        self.handled: set[int] = set()
        self.restarts: set[int] = set()  # generations whose restart was announced
        self.restored = False
        self.seen: dict[int, int] = {}   # uid -> the first generation it was a member of
        self.wiped: dict[int, float] = {}  # step -> first wipe-out event time
        self.top, self.last_step_t = -1, time.time()
        self.checkpoint: str | None = None
        self.stop_posted: float | None = None
        self.drill = LauncherDrill(pending, c.cfg.model, xid_log, self.emit, fired, guard,
                                   kill_node=self._kill_node)
        for u in self.members | set(self.pool):  # XID lines name the pid of any holder
            holders[c.procs[u].pid] = u
        self.layout = make_layout(self.spec.groups, self.spec.ft.redundancy)
        self.holder = {s: s for s in range(self.spec.groups)}  # slot -> its newest holder
        self.stop_code: tuple[int, str] | None = None  # a StopJob carried out
        guard.maskable = self._maskable
        guard.standby = lambda: len(self._warm())  # the ladder counts on the pool as it is
        self.stall_job, self.stall_pool = None, None  # stack dumps off the loop (_stall)
        self.exits = ExitWaiter()

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[int, dict]:
        from unbroken.runtime.ftcomm import declare_dead

        self.declare_dead = declare_dead
        try:
            return self._loop()
        finally:
            self.exits.close()
            for tail in self.tails.values():
                tail.close()
            if self.stall_pool is not None:  # a dump in flight ends with its processes
                self.stall_pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> dict[int, dict]:
        deadline = time.monotonic() + self.spec.timeout
        while True:
            for u in list(self.c.uids):
                for ev in self._tail(u).read():
                    self._on_event(u, ev)
            if self.sup._signal is not None and self.stop_posted is None:
                self._post_stop()
            for ev in getattr(self.c, "drain_events", list)():  # node agents: a node lost,
                self.emit(ev)  # a machine's sample, an XID of its kernel log
                if ev["event"] == Event.NODE_HEALTH:
                    self.guard.on_node_health(ev)
                elif ev["event"] == Event.NODE_XID:
                    self.guard.on_node_xid(ev, time.time())
            self.drill.fire(self.top, self._holder)
            self.guard.poll(time.time(), live=self.members - set(self.finished))
            self._stall()
            self._orders()
            done = self._exits()
            if done is not None:
                return done
            if time.monotonic() > deadline:
                raise RunError(f"no finish within {self.spec.timeout:.0f}s")
            # sleep in the kernel until a process exits (a death is handled at once) or the
            # tick passes (journal lines, the guard's clock): polling here cost a fifth of a
            # core that the training processes on the same cores lacked
            self.exits.wait(self.c.procs.values(), self.TICK_S)

    def _stall(self) -> None:
        """No step for a while but every heartbeat fresh: the stack dumps that localise it run
        on a thread (py-spy pauses each process in turn, seconds in all), so death notices and
        orders keep flowing meanwhile; the vote goes to the guard when it is in."""
        job = self.stall_job
        if job is not None and job.done():
            self.stall_job = None
            try:
                self.guard.on_stall(*job.result())
            except Exception as exc:
                self.guard.stall_failed(exc)
        elif job is None and self.spec.ft.guard == "act" and stall_suspected(
                time.time(), self.last_step_t, self.top >= 0):
            from concurrent.futures import ThreadPoolExecutor

            from unbroken.detect.stacks import locate_stall

            self.last_step_t = time.time()  # re-arm: one localisation per stall period
            # members that have trained in their slot: a spare sent to a slot but not yet
            # admitted waits in its join, an "outlier" in another replica that left every
            # 16-group stall vote of the soak inconclusive
            live = [u for u in self._live() if u in self.joined]
            if self.stall_pool is None:
                self.stall_pool = ThreadPoolExecutor(1, thread_name_prefix="stall")
            self.stall_job = self.stall_pool.submit(
                locate_stall, {u: self.c.procs[u].pid for u in live},
                {u: self.slot_of[u] for u in live}, fault_dir=Path(self.c.journal_dir),
                dump=getattr(self.c, "dump_stacks", None))  # node agents dump their own

    def _post_stop(self, why: str | None = None) -> None:
        """Ask every member to stop after the next committed step (rank 0 reads the key)."""
        self.stop_posted = time.time()
        self.emit({"event": Event.STOP_REQUESTED,
                   "signal": why or signal.Signals(self.sup._signal).name})
        self.c.store.add(STOP_KEY, 1)
        for u in list(self.pool):  # a waiting spare holds nothing: it just goes
            self.c.procs[u].kill()

    def _holder(self, slot: int) -> tuple[int, int] | None:
        held = [u for u in self._live() if self.slot_of[u] == slot]
        return (held[0], self.c.procs[held[0]].pid) if held else None

    def _tail(self, u: int) -> _Tail:
        if u not in self.tails:
            tail = self.tails[u] = _Tail(Path(self.c.journal_dir) / f"group-{u}.jsonl")
            if self.skip_old:  # skip what a previous incarnation or run wrote
                tail.pos = tail.path.stat().st_size if tail.path.exists() else 0
        return self.tails[u]

    def _live(self) -> list[int]:
        return sorted(u for u in self.members
                      if u not in self.finished and self.c.procs[u].poll() is None)

    # ------------------------------------------------------------------ journal events
    def _on_event(self, u: int, ev: dict) -> None:
        name, emit = ev.get("event"), self.emit
        if name == Event.FAULT:
            self.victims.add(ev.get("uid", ev["group"]))
            self.fired.add(Fault(ev["kind"], ev["group"], ev.get("at", ev["step"])))
        if name in (Event.STOPPED, Event.COORDINATOR_LOST) and ev.get("checkpoint"):
            self.checkpoint = ev["checkpoint"]
        if name == Event.RESTORE and self.restarting and not self.restored \
                and ev.get("reason") != "verdict":
            self.restored = True
            emit({"event": Event.RESTART, "step": ev["step"], "source": ev["source"],
                  "reason": "wipe-out without replacements", "t": self.t_decided,
                  "t_ready": ev["t"]})
        if name == Event.RESTART:  # one per survivor; the driver's line counts it once
            if ev["gen"] not in self.restarts:
                self.restarts.add(ev["gen"])
                emit({"event": Event.RESTART, "step": ev["step"], "source": ev["source"],
                      "reason": "wipe-out", "t_ready": ev["t"],
                      "t": self.wiped.get(ev["step"], ev["reform_at"])})
            ev = {**ev, "event": Event.RESTARTED}
        emit(ev, src=f"group-{u}")
        now = time.time()
        if name == Event.COMMIT:
            self.guard.on_commit(ev, uid=u)
            if ev["step"] > self.top:
                self.top, self.last_step_t = ev["step"], now
        elif name == Event.INCIDENT:
            self.guard.on_incident(ev, now)
        elif name == Event.REPLAY:
            self.guard.on_replay(ev, now)
        elif name == Event.SDC_CHECK:
            self.guard.on_check(ev)
        elif name == Event.HEALTH:
            self.guard.on_health(ev, u)
        elif name == Event.JOINED:
            self.joined.add(u)
            emit({"event": Event.JOIN, "uid": u, "slot": ev["slot"], "step": ev["step"]})
        elif name == Event.WIPEOUT:
            self.wiped.setdefault(ev["step"], ev["t"])
        if "members" in ev and "gen" in ev:
            for m in ev["members"]:  # lines of several journals arrive out of order: the least
                self.seen[m] = min(self.seen.get(m, ev["gen"]), ev["gen"])
        if name in (Event.REPLAN, Event.WIPEOUT) and "members" in ev:
            # a holder the survivors re-formed without while its process lives: a hang
            holders = {u: self.seen[u] for u in self.members - self.handled if u in self.seen}
            for gone in left_behind(holders, ev.get("gen", math.inf), ev["members"]):
                if gone not in self.finished and self.c.procs[gone].poll() is None:
                    self._lost(gone, "heartbeat")

    # ------------------------------------------------------------------ losses and orders
    def _maskable(self, lost: tuple[int, ...]) -> bool:
        """Can the holders of the other slots cover every shard type without ``lost``?"""
        live = {self.slot_of[u] for u in self.members
                if u not in lost and u not in self.finished and self.c.procs[u].poll() is None}
        return not uncovered(self.layout, live)

    def _lost(self, uid: int, how: str) -> None:
        """A member died (exit) or hung (left behind): the ladder answers. When the slots
        without a holder leave a shard type uncovered (a wipe-out), the fault names every such
        slot's last holder, so one answer refills them all (``core.placement.wiped_out``)."""
        for ev in self._tail(uid).read():  # its own last lines first: an injected fault says so
            self._on_event(uid, ev)
        now = time.time()
        if uid not in self.victims:  # a real failure, not a fire drill:
            self.emit({"event": Event.FAULT, "kind": "death" if how == "exit" else "hang",
                       "group": self.slot_of[uid], "uid": uid, "step": self.top + 1,
                       "external": True, "t": now})  # accounted like an injected one
        if self._maskable((uid,)) or self.stop_posted is not None:
            self.guard.on_member_lost(uid, how, now)
        else:
            gone, why = wiped_out(self.holder, {self.slot_of[u] for u in self.members
                                                 if u != uid}, uid)
            self._evict(uid, how)  # this one is out first; the answer refills every slot
            self.guard.on_wipeout(gone, now, why)
        self._orders()

    def _orders(self) -> None:
        """Carry out the guard's actions in order (``core.actions``: one mapping per rung)."""
        st = self.c.store
        while self.guard.orders:
            a = self.guard.orders.pop(0)
            if isinstance(a, PostCode):
                st.set(code_key(a.n), json.dumps(a.record))
                st.add(CODE_COUNT, 1)  # rank 0 reads it: every member swaps at one boundary
                self.emit({"event": Event.CODE_POSTED, "n": a.n, **a.record})
            elif isinstance(a, PostVerdict):
                st.set(a.key, json.dumps(a.verdict))
                self.emit({"event": Event.VERDICT_POSTED, "key": a.key, **a.verdict})
            elif isinstance(a, Evict):
                self._evict(a.uid, a.how)
            elif isinstance(a, Replace):
                self._replace(a.uid)
            elif isinstance(a, Respawn):
                self._replace(a.uid, fresh=True)
            elif isinstance(a, Quarantine):
                self.emit({"event": Event.QUARANTINE, "group": a.uid,
                           "slot": self.slot_of.get(a.uid)})
            elif isinstance(a, RestartJob):
                raise _Restart(a.reason, a.backoff)
            elif isinstance(a, StopJob):
                self.stop_code = (a.code, a.reason)
                if self._live():
                    self._post_stop(f"ladder: {a.reason}")
                else:
                    raise _Ended(ExitCode(a.code), a.reason)

    def _evict(self, uid: int, how: str) -> None:
        """Take ``uid`` out: SIGKILL if it still runs, a death notice, no longer a member."""
        if uid in self.handled or uid not in self.slot_of:
            return
        if self.c.procs[uid].poll() is None:
            self.c.procs[uid].send_signal(signal.SIGKILL)
            self.c.procs[uid].wait(timeout=10)
        self.declare_dead(self.c.store, uid)  # survivors drop it at once, no heartbeat wait
        self.handled.add(uid)
        self.members.discard(uid)
        self.emit({"event": Event.DETECTED, "group": uid, "slot": self.slot_of[uid], "how": how})

    def _replace(self, uid: int, fresh: bool = False) -> None:
        """The slot of a dead ``uid`` goes to a warm spare, or (``fresh``: retry in place) to a
        new process started for it now."""
        slot = self.slot_of[uid]
        if self.stop_posted is not None or self.holder.get(slot) != uid:
            return  # stopping, or the slot already has a newer holder
        if fresh:
            self._spawn()
            spare = self.pool.pop()  # the one just started, not a warm one
        elif self._warm():
            spare = self.pool.pop(0)
        else:
            self.emit({"event": Event.NO_SPARE, "slot": slot})
            return
        self.slot_of[spare] = slot
        self.holder[slot] = spare
        self.members.add(spare)
        # the slot's next scheduled faults (the old holder's unfired ones included: it is gone)
        drill = holder_faults([f for f in self.pending if f not in self.fired], slot)
        self.c.assign(spare, slot, [(f.kind, f.step) for f in drill])
        self.emit({"event": Event.ASSIGN, "uid": spare, "slot": slot,
                   **({"fresh": True} if fresh else {})})
        for _ in range(refill(len(self.pool))):  # keep one warm for the next fault (its
            self._spawn()                        # start-up takes CPU from training here)

    def _warm(self) -> list[int]:
        """The pool without the spares that died waiting (their node went with them)."""
        self.pool = [u for u in self.pool if self.c.procs[u].poll() is None]
        return self.pool

    def _kill_node(self, f: Fault) -> None:
        """A ``node:I@S`` drill: node I's agent is killed with every process it started
        (``NodeCluster.kill_node``); ``cut:I@S``: it is stopped, its workers run on
        (``NodeCluster.cut_node``). Each member there is a victim of the fault."""
        node_of = getattr(self.c, "node_of", {})
        now = time.time()
        for u in self._live():
            if node_of.get(u) == f.group:
                self.victims.add(u)
                self.emit({"event": Event.FAULT, "kind": f.kind, "group": self.slot_of[u],
                           "uid": u, "node": f.group, "step": f.step, "at": f.step, "t": now})
        self.fired.add(f)
        (self.c.kill_node if f.kind == "node" else self.c.cut_node)(f.group)

    def _spawn(self) -> None:
        self.c.spawn(self.next_uid, standby=True)
        self.holders[self.c.procs[self.next_uid].pid] = self.next_uid
        self.pool.append(self.next_uid)
        self.next_uid += 1

    # ------------------------------------------------------------------ process exits
    def _exits(self) -> dict[int, dict] | None:
        c = self.c
        for u in sorted(self.members):
            if u in self.finished or u in self.stopped:
                continue
            rc = c.procs[u].poll()
            # store round trips only when they can answer: ``done`` follows the last commit,
            # ``error`` comes just before the exit (every tick, for every member, they were
            # most of the supervisor's and the store's CPU)
            if (rc is not None or self.top >= self.spec.steps - 1) \
                    and c.store.check([done_key(u)]):
                self.finished[u] = json.loads(c.store.get(done_key(u)))
                continue
            if rc is None or u in self.handled:
                continue
            if c.store.check([error_key(u)]):
                raise RunError(f"group {u} failed:\n{c.store.get(error_key(u)).decode()}")
            if (rc < 0 or rc == ExitCode.JOIN_FAILED) and self.stop_posted is None:
                self._lost(u, "exit")  # killed by a signal, or a spare whose admission broke
            elif rc == ExitCode.WIPEOUT and self.stop_posted is None:
                # the survivors of a wipe-out waited for replacements in vain
                self._job_lost(f"group {u} got no replacement for a wipe-out in time (exit 4)")
            elif rc in (ExitCode.STOPPED, ExitCode.COORDINATOR_LOST, ExitCode.NO_PROGRESS):
                self.stopped[u] = rc
            elif self.stop_posted is not None:
                self.stopped[u] = rc  # stopping anyway: record, do not replace
            else:
                raise RunError(f"group {u} exited with code {rc}:\n{c.stderr(u)[-2000:]}")
        if self.stopped and self.members & self.joined <= set(self.finished) | set(self.stopped):
            raise self._ended()  # (a replacement never admitted is closed with the attempt)
        if self.finished and self.members & self.joined <= set(self.finished):
            # every member that trained finished; a replacement still starting up (sent in the
            # last steps) was never admitted and has nothing to do: it goes
            for u in self.members - set(self.finished):
                c.procs[u].kill()
            return {u: self.finished[u] for u in sorted(self.finished)}
        if not self.members:
            self._job_lost("every group is gone and no spare is left")
        return None

    def _job_lost(self, why: str) -> None:
        """The in-memory state is gone (no member left to restore from): the ladder answers
        with a restart from the checkpoint (retry in place, restart, requeue after a backoff)
        or gives up. Raises :class:`_Restart` or :class:`_Ended`; the attempt's processes are
        closed either way."""
        self.guard.on_wipeout((), time.time(), why)
        for a in self.guard.orders:
            if isinstance(a, StopJob):
                self.guard.orders.clear()
                raise _Ended(ExitCode(a.code), f"the guard's ladder gave up: {a.reason}")
        self._orders()  # a RestartJob raises
        raise _Restart(why)

    def _ended(self) -> _Ended:
        """Why every member stopped: the most telling code among theirs."""
        codes = set(self.stopped.values())
        if self.stop_code is not None:  # the ladder gave up (a StopJob carried out)
            code, reason = self.stop_code
            where = f"; checkpoint {self.checkpoint}" if self.checkpoint else ""
            return _Ended(ExitCode(code), f"the guard's ladder gave up: {reason}{where}",
                          self.checkpoint)
        where = f"; checkpoint {self.checkpoint}" if self.checkpoint else ""
        step = self.top + 1
        if ExitCode.NO_PROGRESS in codes:
            return _Ended(ExitCode.NO_PROGRESS, f"the guard's ladder gave up at step {step} "
                                                f"(exit 6){where}", self.checkpoint)
        if ExitCode.COORDINATOR_LOST in codes:
            return _Ended(ExitCode.COORDINATOR_LOST,
                          f"the members found the supervisor silent and stopped after step "
                          f"{self.top}{where}; --resume continues", self.checkpoint)
        sig = signal.Signals(self.sup._signal or signal.SIGINT)
        code = ExitCode.INTERRUPTED if sig == signal.SIGINT else ExitCode.TERMINATED
        return _Ended(code, f"stopped on {sig.name} after step {self.top}{where}; --resume "
                            f"continues", self.checkpoint)
