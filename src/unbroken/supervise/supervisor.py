"""The supervisor: launches a job's workers and warm spares, watches them, carries out the guard.

What it owns (and nothing else): the processes. It starts one worker per data-parallel group
and a pool of warm spares, hosts the store in a child process of its own, posts a death
notice the moment a worker exits (the fast path for kills), evicts a member the survivors
re-formed without, sends a spare to every lost slot and keeps the pool full, carries out the
guard's orders (evict, respawn, code records, verdicts), and restarts the job from the durable
checkpoint when a wipe-out cannot be covered. Masking, re-planning, roll-forward, state copies
and in-place restores happen inside the workers (:mod:`unbroken.runtime.stacked`); the
supervisor never decides a plan, and the guard (:mod:`unbroken.guard`) decides every ladder
rung. This file runs the job (signals, the out directory, attempts, the final report); one
attempt's watch-and-repair loop is :mod:`unbroken.supervise.attempt`.

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
  A second signal kills everything at once. Workers sit in their own process group, so a
  terminal's Ctrl-C does not reach them.

Latency budget at the default settings: a kill is noticed from the exit (~0.1 s), a hang from
heartbeats (``staleness``, 0.3 s, once the peers beat three times meanwhile: a starved machine
waits longer, ``core.membership``), a silent supervisor in ``supervisor_staleness`` (5 s).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from unbroken import spawn
from unbroken.core.faults import Fault, format_faults
from unbroken.core.nodes import no_node_left
from unbroken.events import Event
from unbroken.fsio import copy_atomic, sha256_file
from unbroken.protocol import ADOPTED, ExitCode
from unbroken.supervise.adopt import collect, history, journal_sizes, known_uids
from unbroken.supervise.attempt import Attempt
from unbroken.supervise.heartbeat import SupervisorHeartbeat
from unbroken.supervise.launch import make_cluster
from unbroken.supervise.nodes import job_nodes, reachable_host
from unbroken.supervise.outcome import Ended, Restart, RunError, RunResult, params_sha256
from unbroken.supervise.outdir import prepare, read_journal, repair_journals
from unbroken.supervise.spec import (JobSpec, check, check_sharding_of, load_trainer, spares_for,
                                     train_config)

__all__ = ["Supervisor", "RunResult", "RunError"]


class Supervisor:
    """Runs one :class:`JobSpec` to the end; ``emit_line`` gets one line per notable event
    (from ``view.update``), ``view`` (optional) renders the journal live."""

    def __init__(self, spec: JobSpec, *, emit_line: Callable[[str], None] | None = None,
                 view: Any = None, figure: str = "run.png", coordinator: Any = None) -> None:
        self.spec, self.emit_line, self.view, self.figure = spec, emit_line, view, figure
        # --store etcd://: the job's durable state and the lease (supervise.coordinated)
        self.coordinator = coordinator
        self.events: list[dict] = []
        self.signal_received: int | None = None
        self._adopting = False  # a standby taking a running job over (supervise.adopt)
        self._exclusions = None  # the eviction history a taken-over job kept in etcd
        self._before: dict | None = None  # a takeover: the job's journals before it (sizes)
        self._checked = None  # (faults, cfg) once checked
        # a lost lease: None stops the job with a checkpoint; the command line sets
        # supervise.coordinated.stand_by_again (this process becomes a standby of the job)
        self.on_lease_lost: Callable[[], None] | None = None
        # a standby's store host, started while it waits: (handle, port, client, beat client)
        self._prestore = None
        self.adopt_timeout = 15.0  # its wait for a member to re-attach (they take < 0.1 s)

    # ------------------------------------------------------------------ public
    def check(self):
        """Validate the spec and build the trainer once (bad input raises ValueError)."""
        faults = check(self.spec)
        cfg = train_config(self.spec, self.spec.sdc_interval(faults))
        spawn.warm()  # the workers' fork server imports torch while the trainer is built here
        check_sharding_of(self.spec, load_trainer(cfg))
        return faults, cfg

    def run(self) -> RunResult:
        co = self.coordinator
        if co is None:
            return self._run_checked()
        if co.state.lease == 0:  # a standby: checked, its fork server warm, before it waits
            self._checked = self.check()
            if not spawn.wait_warm(300):  # a takeover must not pay torch's import (~1 s)
                self._line("standby: the fork server is not warm yet; standing by anyway")
            else:
                self._start_prestore()
        old = self._install_signals()
        try:  # a standby waits for the lease first; Ctrl-C meanwhile ends it
            took = co.stand_by(lambda: self.signal_received is not None,
                               store=self._prestore[1] if self._prestore else None,
                               host=self._store_host()) \
                if co.state.lease == 0 else True
        finally:
            self._restore_signals(old)
        self._lease_t = time.time()  # the takeover's report splits its latency from here
        if not took:
            self._drop_prestore()
            co.close(finished=False)
            return RunResult(ExitCode.OK, "the job ended under another supervisor", {})
        taken = co.state.read()
        if taken.get("status") == "running":  # taking over
            self._exclusions = taken.get("exclusions")  # the evictions its guard booked
            out = Path(self.spec.out)  # where the job's journals end now: the report covers
            self._before = journal_sizes(out / "journal.jsonl", out / "groups")  # them too
            if self.spec.local_nodes:
                # its own node agents ended with it, and their workers: continue from the
                # newest checkpoint
                self.spec = replace(self.spec, **_continue(Path(self.spec.out)))
            else:  # adopt the members where they stopped (a restart only if that fails);
                # under node agents (--nodes) the agents keep theirs for this one
                self._adopting = True
        if not self._adopting:
            co.withdraw()  # nobody re-attaches: its announcement is of no more use
        co.start()
        res = None
        try:
            res = self._run_checked()
            return res
        finally:
            co.close(finished=res is not None and res.code == ExitCode.OK)

    def _run_checked(self) -> RunResult:
        spec = self.spec
        faults, cfg = self._checked if self._checked is not None else self.check()
        out = Path(spec.out)
        exporter = None
        if spec.ft.metrics_port is not None:  # bind first: a bad port fails before anything runs
            from unbroken.metrics import MetricsExporter

            exporter = MetricsExporter(spec.ft.metrics_port)
        try:  # adopting: the run directory is the running job's, kept as it is (made if the
            # job died before it wrote one: nobody re-attaches, the restart starts there)
            if self._adopting:
                out.mkdir(parents=True, exist_ok=True)
            found = prepare(out, resume=spec.resume, fresh=spec.fresh) if not self._adopting \
                else {"resume_step": None, "kept_in": None}
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
        self._merged = open(out / "journal.jsonl", "a" if spec.resume or self._adopting
                            else "w", buffering=1)
        if self._adopting and self._merged.tell() > 0:  # a line the dead one left half
            self._merged.write("\n")  # written stays a damaged line of its own
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
        co = self.coordinator
        if co is not None:
            co.on_event(ev)  # durable changes only: no etcd write per step
            if co.lost and self.signal_received is None:  # deposed: stop acting, keep state
                if self.on_lease_lost is not None:
                    self._line("the etcd lease is lost: standing by; the members pause after "
                               "one committed step until a supervisor holds the lease")
                    if getattr(self, "_merged", None) is not None:
                        self._merged.flush()
                    self.on_lease_lost()  # does not return
                self._line("the etcd lease is lost: stopping the job with a checkpoint")
                self.signal_received = signal.SIGTERM
        ev.setdefault("t", time.time())
        self.events.append(ev)
        self._merged.write(json.dumps(ev) + "\n")
        line = self.view.update(ev) if self.view is not None else None
        if line:
            self._line(line)
        if self._exporter is not None and time.monotonic() - self._last_export > 0.5:
            self._last_export = time.monotonic()  # the report is O(journal): refresh at 2 Hz
            self._exporter.update(self.events)

    def _backoff(self, seconds: float) -> Ended | None:
        """Wait a requeue's backoff; a signal meanwhile ends the run (the checkpoint is on
        disk already: nothing is running)."""
        deadline = time.monotonic() + seconds
        while True:  # a signal before the next attempt starts ends the run, backoff or not
            if self.signal_received is not None:
                sig = signal.Signals(self.signal_received)
                code = ExitCode.INTERRUPTED if sig == signal.SIGINT else ExitCode.TERMINATED
                return Ended(code, f"stopped on {sig.name} while waiting to restart; "
                                    f"--resume continues from the last checkpoint")
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum, _frame):
            if self.signal_received is not None:  # the second one: no more waiting
                raise KeyboardInterrupt
            self.signal_received = signum

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
        if self._exclusions:  # a takeover: the nodes its predecessor quarantined stay so
            from unbroken.core.exclusion import ExclusionError

            try:
                guard.restore_exclusions(self._exclusions)
            except ExclusionError as e:
                self._line(f"etcd: the job's exclusions are not usable, starting without: {e}")
        from unbroken.nodes.directory import NodeStartError

        try:
            # node agents: one directory for the job's life (named in etcd with --store)
            with job_nodes(spec, self._line, self.coordinator) as directory:
                done, ended = self._attempts(faults, cfg, out, jdir, xid_log, spares, guard,
                                             holders, directory)
        except NodeStartError as e:  # the agents did not come: the run cannot start
            raise RunError(str(e).splitlines()[0]) from None
        return self._finish(done, ended, cfg, out, jdir, t_start)

    def _attempts(self, faults, cfg, out: Path, jdir: Path, xid_log, spares: int, guard,
                  holders: dict, directory) -> tuple[dict | None, Ended | None]:
        """Attempts of the job until one finishes or the job ends: (done, ended)."""
        spec = self.spec
        fired: set[Fault] = set()  # the schedule's faults that fired (kind, slot, step named)
        attempt, done, ended, backoff = 0, None, None, 0.0
        while done is None and ended is None:
            pending = [f for f in faults if f not in fired]
            if attempt > 0 and directory is not None:  # agents that died during the backoff
                for k, why in directory.fence_silent(3 * spec.ft.node_staleness).items():
                    self.emit({"event": Event.NODE_LOST, "node": k, "reason": why, "uids": []})
                why = no_node_left(directory.live())
                if why is not None:  # nothing to restart on: the checkpoint waits
                    ended = Ended(ExitCode.NO_PROGRESS, why)
                    break
            co, adopting = self.coordinator, self._adopting and attempt == 0
            c = make_cluster(cfg, jdir, spares, spec, out / "ckpt",
                             resume=attempt > 0 or spec.resume, pending=pending,
                             directory=directory,
                             extra_argv=co.worker_argv() if co is not None else (),
                             adopt_from=max([spec.groups - 1, *known_uids(jdir)]) + 1
                             if adopting else None,
                             store_host=self._prestore)
            beat_client = None
            if self._prestore is not None:
                beat_client, self._prestore = self._prestore[3], None  # the cluster's now
            # ten beats per window the members judge it by: faster is store traffic that
            # tells them nothing more. Beating from the store's start: members re-attaching
            # to it judge this supervisor from then on, while the others still come
            beat = SupervisorHeartbeat(c.store, max(spec.ft.heartbeat,
                                           spec.ft.supervisor_staleness / 10), beat_client)
            if co is not None:
                # where the members re-attach from: other machines' with --nodes
                co.publish_store(c.store, c.port, self._store_host())
            adopted = self._adopt(c, jdir) if adopting else None
            if adopting and adopted is None:  # restart from the checkpoint it left instead
                co.withdraw()
                beat.stop()
                c.close()
                attempt = 1
                continue
            guard.new_attempt()
            run = None
            try:
                run = Attempt(spec, self.emit, lambda: self.signal_received, c, fired, guard,
                              pending, xid_log, holders, restarting=attempt > 0,
                              skip_old=attempt > 0 or spec.resume or adopting, adopted=adopted)
                if adopted is not None:
                    # the go names who was adopted: a member that reports later (after the
                    # adopt timeout; adopted as lost, replaced) reads it and leaves
                    c.store.set(ADOPTED, json.dumps(sorted(set(adopted.members)
                                                           - set(adopted.missing))))
                    co.withdraw()  # connected: no member needs the announcement any more
                    # the job's events before this standby, for its report: read while
                    # the members train, not before the go (whole journals)
                    self._take_history(out, jdir)
                done = run.run()
            except Restart as r:  # the ladder's budget bounds these (core.ladder)
                attempt, backoff = attempt + 1, r.backoff
                self.emit({"event": Event.RESTART_REQUESTED, "reason": str(r), "attempt": attempt,
                           "backoff_s": r.backoff})
            except Ended as e:
                ended = e
            finally:
                beat.stop()
                c.close()
                for ev in getattr(c, "drain_events", list)():  # found while it closed
                    self.emit(ev)
                if run is not None:  # what its processes wrote until the close
                    run.drain()
            if ended is None and done is None:
                ended = self._backoff(backoff)
        return done, ended

    def _take_history(self, out: Path, jdir: Path) -> None:
        """A takeover's report covers the whole job: the events from before it, once."""
        if self._before is not None:
            self.events[:] = sorted(history(out / "journal.jsonl", jdir, self._before)
                                    + self.events, key=lambda e: e.get("t", 0.0))
            self._before = None

    def _start_prestore(self) -> None:
        """A standby's store, up before it is needed, with this supervisor's client and its
        beat's client: the members connect to it ahead (``runtime.reattach``), so a takeover
        makes no connect (each costs torch's reverse DNS lookup of the client's address)."""
        import torch.distributed as dist

        from unbroken.supervise.local import start_store_host

        host, port = start_store_host(os.path.join(
            tempfile.gettempdir(), f"unbroken-standby-store-{os.getpid()}.err"))
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=10))
        self._prestore = (host, port, client, client.clone())

    def _store_host(self) -> str:
        """Where the members reach this supervisor's store: its address on the default route
        with agents on other machines (``--nodes``), else loopback. A standby announces its
        store under the same name it will publish at a takeover: the members match the two
        to use the connection they made ahead."""
        return reachable_host() if self.spec.nodes else "127.0.0.1"

    def _drop_prestore(self) -> None:
        if self._prestore is not None:
            self._prestore[0].kill()
            self._prestore[0].wait(timeout=10)
            self._prestore = None

    def _adopt(self, c, jdir: Path):
        """A standby's first attempt: wait for the running members to re-attach to this
        store, decide (``core.coordination.adoption``) and hand them to the cluster; None
        (said in a line) when there is nothing to adopt: the job restarts from its
        checkpoint."""
        t0 = time.time()
        adopted, why, reports = collect(c.store, known_uids(jdir) | set(range(self.spec.groups)),
                                        self.adopt_timeout, self.spec.ranks_per_group)
        self._line(f"standby: {why}")
        if adopted is None:
            c.drop_paused(reports)  # paused at a boundary: the restart replaces them
            self.emit({"event": Event.RESTART_REQUESTED, "reason": f"takeover: {why}",
                       "attempt": 1, "backoff_s": 0.0})
            return None
        c.adopt(adopted.members, {u: r["pids"] for u, r in reports.items()},
                {u: r.get("node") for u, r in reports.items()})
        self._before = journal_sizes(Path(self.spec.out) / "journal.jsonl", jdir)
        stopped = [r["stopped_t"] for r in reports.values() if "stopped_t" in r]
        self.emit({"event": Event.TAKEOVER, "leader": self.coordinator.state.me,
                   "step": adopted.step, "gen": adopted.gen, "members": list(adopted.members),
                   "missing": list(adopted.missing), "behind": list(adopted.behind),
                   "reason": why,
                   "stopped_t": min(stopped) if stopped else None,
                   "lease_t": getattr(self, "_lease_t", None),
                   "adopted_s": round(time.time() - t0, 3)})
        return adopted

    def _finish(self, done, ended, cfg, out: Path, jdir: Path, t_start: float) -> RunResult:
        from unbroken.demo_report import build_report, straggler_report
        from unbroken.core.ledger import check_ledger

        spec = self.spec
        self._take_history(out, jdir)  # a takeover that restarted from the checkpoint
        journals = {int(f.stem.split("-")[1]): read_journal(f)
                    for f in sorted(jdir.glob("group-*.jsonl"))}
        # the job's start: an adopting standby's report covers its predecessors' part too
        t_start = min([t_start, *(e["t"] for e in self.events if e.get("event") == Event.START
                                  and isinstance(e.get("t"), (int, float)))])
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
            ended = Ended(ExitCode.FAILED, bad_ledger)
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
        params = {u: d["params"] for u, d in done.items()}
        report["params_sha256"] = params_sha256(params)
        return RunResult(ExitCode.OK, None, report, params=params)



def _continue(out: Path) -> dict:
    """A standby taking over: resume from the newest checkpoint in ``out``, or start over
    (keeping what is there) when the job died before its first one."""
    from unbroken.runtime.checkpoint import CheckpointStore

    ckpt = out / "ckpt"
    if ckpt.is_dir() and CheckpointStore(ckpt, log=lambda _m: None).latest() is not None:
        return {"resume": True, "fresh": False}
    return {"resume": False, "fresh": True}


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

