"""Worker entry point for stacked data-parallel training, and its local launcher.

``python -m unbroken.runtime.stacked_worker --uid U --port P --config JSON --journal DIR``
runs :class:`~unbroken.runtime.stacked.StackedRunner` for group ``U`` over an ``FTComm`` whose
store the launcher hosts. ``--standby`` makes it a warm spare: imports done and model built, it
posts ``standby/<uid>`` and waits for ``assign/<uid>`` (a layout slot), then joins the running
job at the next step boundary (or at once when a wipe-out is waiting for it).

It writes ``DIR/group-U.jsonl`` (one line per event, line-buffered, so a SIGKILLed group's
committed steps survive it) and reports through the store:

* ``done/<uid>``: ``{"params": [...], "steps"}`` at the end (then waits for the other
  members' ``done`` so nobody leaves a peer inside the last collective); exit code 0;
* ``wipeout/<uid>``: posted by each survivor of a wipe-out while it waits for replacements;
  ``wipeout_failed/<uid>`` and exit code 4 if none came (restart from a durable checkpoint);
* ``error/<uid>``: a traceback, exit code 3;
* ``killed/<uid>`` / ``stopped/<uid>``: wall time just before a self-inflicted SIGKILL /
  SIGSTOP (test fault injection at deterministic points, see ``unbroken.testing.faults``).

Exit codes: 0 done, 3 error, 9 left out of a generation (a spare whose admission broke, or a
member the others re-formed without; the launcher treats it as lost and sends a spare), 4 unmaskable wipe-out without replacements, 5 the coordinator
(the store host) is gone: every member stopped after the same committed step and rank 0 wrote a
durable checkpoint of it (``--ckpt-dir``), from which ``--resume`` continues; 6 the guard's
ladder gave up on an incident (``--verdicts``), or no verdict came.

``StackedCluster`` reuses :class:`~unbroken.runtime.ftcomm_worker.LocalCluster` (store hosting,
waiting on keys and process exits, kill, close) and only starts this worker instead.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from datetime import timedelta

from unbroken.events import Event
from unbroken.spawn import pdeathsig
from unbroken.protocol import (ExitCode, assign_key, drill_key, killed_key, node_fenced_key,
                               standby_key, stopped_key, wipeout_failed_key)
from unbroken.runtime.ftcomm_worker import LocalCluster, finish, hard_exit, report_error


def worker_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--uid", type=int, default=None,
                    help="group id; under torchrun (--from-env) it is the global RANK")
    ap.add_argument("--host", default="127.0.0.1", help="the coordinator's store")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--from-env", action="store_true",
                    help="launched by torchrun: uid = $RANK, and $WORLD_SIZE must equal the "
                         "config's groups")
    ap.add_argument("--config", required=True, help="TrainConfig as JSON")
    ap.add_argument("--journal", required=True, help="directory for group-<uid>.jsonl")
    ap.add_argument("--standby", action="store_true",
                    help="a warm spare: wait for assign/<uid> = slot, then join")
    ap.add_argument("--drill", default=None, metavar="JSON",
                    help="the slot's scheduled faults this process injects: [[kind, step], ...] "
                         "(core.faults.holder_faults); a spare gets its own with the assignment")
    ap.add_argument("--die-at", type=int, default=None)
    ap.add_argument("--stop-at", type=int, default=None)
    ap.add_argument("--die-after-replan", action="store_true")
    ap.add_argument("--die-in-patch", action="store_true")
    ap.add_argument("--die-in-retry", action="store_true")
    ap.add_argument("--drop-commit-at", type=int, default=None)
    ap.add_argument("--drop-commit-on-join", action="store_true")
    ap.add_argument("--corrupt-snapshot", action="store_true")
    ap.add_argument("--slow-from", type=int, default=None,
                    help="from this step on, every gradient takes --slow-s longer (straggler)")
    ap.add_argument("--slow-s", type=float, default=0.06)
    ap.add_argument("--stall-at", type=int, default=None,
                    help="block the main thread for good at this step (heartbeat goes on)")
    ap.add_argument("--nan-at", type=int, default=None, help="one NaN in a gradient, once")
    ap.add_argument("--flip-from", type=int, default=None,
                    help="from this step on, flip one bit of every gradient (silent corruption)")
    ap.add_argument("--verdicts", action="store_true",
                    help="on a bad step check, wait for the guard's verdict/<step>/<n>")
    ap.add_argument("--heartbeat", type=float, default=0.1)
    ap.add_argument("--staleness", type=float, default=0.3)
    ap.add_argument("--pg-timeout", type=float, default=30.0)
    ap.add_argument("--wipeout-wait", type=float, default=60.0,
                    help="how long wipe-out survivors wait for replacements (s)")
    ap.add_argument("--ckpt-dir", default=None, help="durable checkpoints (written by rank 0)")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--resume", action="store_true",
                    help="start from the newest valid checkpoint in --ckpt-dir")
    ap.add_argument("--supervisor-staleness", type=float, default=0.0,
                    help="stop (exit 5, with a checkpoint) when the supervisor's heartbeat has "
                         "not moved for this long (s; 0: not watched)")
    ap.add_argument("--node", type=int, default=None,
                    help="started by node agent I (unbroken.nodes): die with the agent")
    ap.add_argument("--health-every", type=float, default=1.0,
                    help="the health agent's period in s (0: off)")
    a = ap.parse_args(argv)

    import torch

    from unbroken.runtime.ftcomm import FTComm, RendezvousError, StoreLostError
    from unbroken.runtime.stacked import (
        CoordinatorLostError,
        GuardStopError,
        StackedRunner,
        StopRequested,
        WipeOutError,
    )
    from unbroken.runtime.config import TrainConfig

    torch.set_num_threads(1)
    from unbroken.detect.stacks import install_faulthandler

    # stack dumps on SIGUSR1 for hang localisation when py-spy is not there
    install_faulthandler(os.path.join(a.journal, "stacks") if os.path.isdir(
        os.path.join(a.journal, "stacks")) else a.journal)
    cfg = TrainConfig.from_json(a.config)
    if a.from_env:
        a.uid = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.groups:
            ap.error(f"WORLD_SIZE {world} != groups {cfg.groups} in --config")
    if a.uid is None:
        ap.error("--uid is required (or --from-env under torchrun)")
    os.makedirs(a.journal, exist_ok=True)
    comm = runner = None
    code = 0
    jf = open(os.path.join(a.journal, f"group-{a.uid}.jsonl"), "a", buffering=1)
    jlock = threading.Lock()  # the health agent's thread journals too

    def journal(ev: dict) -> None:
        with jlock:
            jf.write(json.dumps(ev) + "\n")  # line-buffered: in the kernel before the next step

    def on_fault(kind: str) -> None:
        comm.store.set((stopped_key if kind == "hang" else killed_key)(a.uid), repr(time.time()))

    from unbroken.testing.faults import from_flags

    slowdown = None
    if cfg.stragglers is not None:
        from unbroken.runtime.stragglers import own_slowdowns

        # keyed by the uid: a straggler is a slow machine, so a spare that takes over the
        # slot runs at full speed (see unbroken.core.stragglers)
        slowdown = own_slowdowns(cfg.stragglers, a.uid, cfg.groups, cfg.steps, cfg.seed)
    faults = from_flags(a, on_fault, slowdown)
    try:
        comm = FTComm(a.uid, list(range(cfg.groups)), host=a.host, port=a.port,
                      heartbeat_period=a.heartbeat, staleness=a.staleness,
                      pg_timeout=a.pg_timeout, joining=a.standby, backend=cfg.backend,
                      supervisor_staleness=a.supervisor_staleness)
        if cfg.sync == "sync":  # today's runner; the modes' imports (scipy's clustering,
            make_runner = StackedRunner  # ~0.8 s on a loaded machine) are not paid for
        else:
            from unbroken.runtime.syncmodes import make_runner
        runner = make_runner(cfg, a.uid, faults.comm(comm), journal, hooks=faults.hooks,
                               wipeout_wait=a.wipeout_wait, ckpt_dir=a.ckpt_dir,
                               ckpt_every=a.ckpt_every, verdicts=a.verdicts)
        if a.resume:
            runner.resume()
        # connected and built: from here the launcher's death reaches us as the store's (or its
        # heartbeat's) loss, and we stop after a committed step with a checkpoint (exit 5).
        # Under a node agent (--node) we keep it: the node's processes end with its agent
        if a.node is None:
            pdeathsig(0)
        else:
            _fence(comm.store, a.node)

        def start_health() -> None:  # a member's agent; a waiting spare has nothing to report
            if a.health_every > 0:
                from unbroken.detect.health import HealthAgent

                HealthAgent(a.uid, journal, lambda: {
                    "step": runner.step, "slot": runner.slot_of.get(a.uid),
                    "compute_s": round(runner.compute_s / max(1, runner.compute_n), 6)},
                    period=a.health_every).start()
        if a.standby:
            comm.store.set(standby_key(a.uid), "ready")  # warm: imports done, model built
            comm.store.wait([assign_key(a.uid)], timedelta(hours=24))
            if comm.store.check([drill_key(a.uid)]):  # the slot's next scheduled faults
                if faults.hooks.load(json.loads(comm.store.get(drill_key(a.uid))), a.slow_s):
                    runner.trainer = faults.hooks.wrap_trainer(runner, runner.trainer)
            start_health()
            runner.join(int(comm.store.get(assign_key(a.uid))))
        else:
            start_health()
        params = _profiled(runner.run, a.uid)
        finish(comm, a.uid, {"params": params.tolist(), "steps": runner.step,
                             "journal": comm.journal})
    except GuardStopError as exc:
        code = ExitCode.NO_PROGRESS
        journal({"event": Event.GUARD_STOP, "error": str(exc), "t": time.time()})
    except StopRequested as exc:
        # contract: every member stopped after the same committed step; rank 0 checkpoints it
        code = ExitCode.STOPPED
        path = runner.save_checkpoint_now()
        journal({"event": Event.STOPPED, "step": runner.step, "checkpoint": path,
                 "error": str(exc), "t": time.time()})
    except RendezvousError as exc:
        # left out of a generation: a spare whose admission broke, or a member the others
        # re-formed without (judged silent on a starved machine). The job goes on without it;
        # the launcher treats it as lost and sends a spare, as for a death
        code = ExitCode.JOIN_FAILED
        journal({"event": Event.LEFT_OUT, "step": runner.step if runner is not None else None,
                 "error": str(exc)[:300], **(comm.beat_report() if comm is not None else {}),
                 "t": time.time()})
    except WipeOutError as exc:
        code = ExitCode.WIPEOUT
        if comm is not None:
            comm.store.set(wipeout_failed_key(a.uid), json.dumps(str(exc)))
    except (CoordinatorLostError, StoreLostError) as exc:
        # contract: every member stopped after the same committed step; rank 0 leaves a
        # durable checkpoint of it, so ``--resume`` continues exactly once from there
        code = ExitCode.COORDINATOR_LOST
        path = runner.save_checkpoint_now()
        journal({"event": Event.COORDINATOR_LOST, "step": runner.step, "checkpoint": path,
                 "error": str(exc), "t": time.time()})
    except BaseException:
        code = report_error(comm, a.uid)
    jf.close()
    hard_exit(code)


def _fence(store, node: int) -> None:
    """Under node agent ``node``: leave at once (exit 10) when the coordinator gives the node
    up (``node_fenced/<node>``: its agent was cut off). The survivors are dropping this
    member meanwhile; one that trained on would be a second holder of its slot. A blocking
    wait on its own client: the store wakes it, no polling."""
    st = store.clone()

    def wait() -> None:
        try:
            st.wait([node_fenced_key(node)], timedelta(days=30))
        except Exception:  # the store is gone: the training loop sees that itself
            return
        hard_exit(ExitCode.FENCED)
    threading.Thread(target=wait, name="node-fence", daemon=True).start()


def _profiled(run, uid: int):
    """``run()``, under cProfile timed by this thread's CPU clock when ``UNBROKEN_PROFILE``
    names a directory (``bench/step_breakdown.py``: what each part of the step costs)."""
    out = os.environ.get("UNBROKEN_PROFILE")
    if not out:
        return run()
    import cProfile

    prof = cProfile.Profile(time.thread_time)
    try:
        return prof.runcall(run)
    finally:
        prof.dump_stats(os.path.join(out, f"group-{uid}.prof"))


class StackedCluster(LocalCluster):
    """``LocalCluster`` that starts stacked training workers (uids ``0..groups-1``) and
    ``spares`` warm standby processes (uids ``groups..``) that join when assigned a slot.

    ``die_at`` / ``stop_at`` / ``drop_commit_at``: uid -> step; ``die_after_replan``,
    ``die_in_patch``, ``die_in_retry``, ``corrupt_snapshot``, ``drop_commit_on_join``: uids
    (see ``unbroken.testing.faults``); ``drill``: uid -> its slot's scheduled faults
    ``[(kind, step), ...]`` (``core.faults.holder_faults``; the supervisor's route).
    """

    def __init__(self, cfg, journal_dir: str, *, die_at: dict[int, int] | None = None,
                 drill: dict[int, list[tuple[str, int]]] | None = None,
                 stop_at: dict[int, int] | None = None,
                 drop_commit_at: dict[int, int] | None = None,
                 slow_from: dict[int, int] | None = None,
                 stall_at: dict[int, int] | None = None,
                 nan_at: dict[int, int] | None = None,
                 flip_from: dict[int, int] | None = None, verdicts: bool = False,
                 die_after_replan=(), die_in_patch=(), die_in_retry=(), corrupt_snapshot=(),
                 drop_commit_on_join=(),
                 spares: int = 0, heartbeat: float = 0.1, staleness: float = 0.3,
                 pg_timeout: float = 30.0, wipeout_wait: float = 60.0,
                 ckpt_dir: str | None = None, ckpt_every: int = 50, resume: bool = False,
                 store_port: int | None = None, store_process: bool = False,
                 supervisor_staleness: float = 0.0) -> None:
        import torch.distributed as dist

        self.cfg = cfg
        self.uids: list[int] = []
        self.spares = list(range(cfg.groups, cfg.groups + spares))
        self.journal_dir = journal_dir
        self._init_procs()
        self.store_host = None
        if store_process and store_port is None:  # the store outlives a stopped launcher
            from unbroken import spawn

            self.store_host = spawn.start("unbroken.runtime.store_host:main", [],
                                          stderr_path=self._errpath("store"), channel=True)
            try:
                store_port = int(self.store_host.receive(timeout=120))
            except (TimeoutError, EOFError):
                raise RuntimeError(f"the store host did not start (rc {self.store_host.poll()}):"
                                   f" {self.stderr('store')[-500:]}") from None
        if store_port is None:  # host the store here: the launcher is the coordinator
            self.store = dist.TCPStore("127.0.0.1", 0, is_master=True,
                                       wait_for_workers=False, timeout=timedelta(seconds=60))
        else:  # a store hosted elsewhere (a test kills it to play a dead coordinator)
            self.store = dist.TCPStore("127.0.0.1", store_port, is_master=False,
                                       wait_for_workers=False, timeout=timedelta(seconds=10))
        self.port = self.store.port
        self._common = ["--port", str(self.port), "--config", cfg.to_json(),
                        "--journal", journal_dir, "--heartbeat", str(heartbeat),
                        "--staleness", str(staleness), "--pg-timeout", str(pg_timeout),
                        "--wipeout-wait", str(wipeout_wait), "--ckpt-every", str(ckpt_every),
                        *(["--ckpt-dir", ckpt_dir] if ckpt_dir else []),
                        *(["--resume"] if resume else []),
                        *(["--supervisor-staleness", str(supervisor_staleness)]
                          if supervisor_staleness > 0 else []),
                        *(["--verdicts"] if verdicts else [])]
        flags = {"--die-after-replan": die_after_replan, "--die-in-patch": die_in_patch,
                 "--die-in-retry": die_in_retry, "--corrupt-snapshot": corrupt_snapshot,
                 "--drop-commit-on-join": drop_commit_on_join}
        steps = {"--die-at": die_at or {}, "--stop-at": stop_at or {},
                 "--drop-commit-at": drop_commit_at or {}, "--slow-from": slow_from or {},
                 "--stall-at": stall_at or {}, "--nan-at": nan_at or {},
                 "--flip-from": flip_from or {}}
        # spares first: a spare started after the members competes for the cores with a job
        # already training (all of it one scheduling group, ``unbroken.spawn``), and at 16
        # groups one took 4 s to be ready, too late for the run that needed it
        for u in [*self.spares, *range(cfg.groups)]:
            extra = [f for f, us in flags.items() if u in us]
            if drill and drill.get(u):
                extra += ["--drill", json.dumps([list(f) for f in drill[u]])]
            for f, m in steps.items():
                if u in m:
                    extra += [f, str(m[u])]
            self.spawn(u, standby=u in self.spares, extra=extra)

    def spawn(self, uid: int, *, standby: bool = False, extra: list[str] = ()) -> None:
        """Start worker ``uid`` (a warm spare with ``standby``). It dies with this launcher
        while it starts up (:mod:`unbroken.spawn`) and sits in a process group of its own,
        so a terminal's Ctrl-C reaches the launcher only."""
        self._start(uid, "unbroken.runtime.stacked_worker:worker_main",
                    ["--uid", str(uid), *self._common, *(["--standby"] if standby else []),
                     *extra])
        self.uids.append(uid)
        if standby and uid not in self.spares:
            self.spares.append(uid)

    def assign(self, spare: int, slot: int, drill: list[tuple[str, int]] = ()) -> None:
        """Send a warm spare to take over layout ``slot`` (it joins at the next step boundary,
        or at once when the survivors are waiting for it after a wipe-out); ``drill``: the
        slot's next scheduled faults, which it injects."""
        if drill:
            self.store.set(drill_key(spare), json.dumps([list(f) for f in drill]))
        self.store.set(assign_key(spare), str(slot))

    def close(self) -> None:
        super().close()
        if self.store_host is not None and self.store_host.poll() is None:
            self.store_host.kill()
            self.store_host.wait(timeout=10)

    def journal(self, uid: int) -> list[dict]:
        path = os.path.join(self.journal_dir, f"group-{uid}.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    worker_main()
