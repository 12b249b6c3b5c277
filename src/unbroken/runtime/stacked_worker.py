"""Worker entry point for stacked data-parallel training.

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
  SIGSTOP (posted by the fault plug-in, ``unbroken.testing.faults``).

Exit codes: 0 done, 3 error, 9 left out of a generation (a spare whose admission broke, or a
member the others re-formed without; the launcher treats it as lost and sends a spare), 4 unmaskable wipe-out without replacements, 5 the coordinator
(the store host) is gone: every member stopped after the same committed step and rank 0 wrote a
durable checkpoint of it (``--ckpt-dir``), from which ``--resume`` continues; 6 the guard's
ladder gave up on an incident (``--verdicts``), or no verdict came.

Fault injection is not here: a launcher that wants faults names a plug-in (``--plugin
unbroken.testing.faults:install --plugin-args JSON``, see :mod:`unbroken.runtime.hooks`); the
local launcher is :class:`unbroken.supervise.local.StackedCluster`.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import replace
from datetime import timedelta

from unbroken.events import Event
from unbroken.spawn import pdeathsig
from unbroken.protocol import (ExitCode, assign_key, exit_key, group_pg_prefix,
                               node_fenced_key, standby_key, wipeout_failed_key)
from unbroken.runtime.ftcomm_worker import finish, hard_exit, report_error


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
    ap.add_argument("--rank", type=int, default=0,
                    help="this process's rank in its group of the config's ranks_per_group "
                         "(rank 0 writes the group's journal and reports)")
    ap.add_argument("--standby", action="store_true",
                    help="a warm spare: wait for assign/<uid> = slot, then join")
    ap.add_argument("--plugin", default=None, metavar="MODULE:FUNC",
                    help="a plug-in to install (unbroken.runtime.hooks): FUNC(args, uid, cfg) "
                         "-> Plugin; the launcher names unbroken.testing.faults:install when "
                         "a run injects faults. None by default")
    ap.add_argument("--plugin-args", default="{}", metavar="JSON",
                    help="the plug-in's arguments, a JSON object")
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
    ap.add_argument("--etcd", default=None, metavar="URL",
                    help="etcd://HOST:PORT,... holding the job's state (with --job): when the "
                         "store goes away, re-attach to the store of the supervisor that "
                         "takes the lease over instead of exiting 5 (runtime.reattach)")
    ap.add_argument("--job", default=None, help="the job's name in --etcd")
    ap.add_argument("--reattach-timeout", type=float, default=60.0, metavar="S",
                    help="how long a member waits for a new coordinator, then for its go")
    ap.add_argument("--node", type=int, default=None,
                    help="started by node agent I (unbroken.nodes): die with the agent")
    ap.add_argument("--health-every", type=float, default=1.0,
                    help="the health agent's period in s (0: off)")
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

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
    ranks = cfg.ranks_per_group
    if not 0 <= a.rank < ranks:
        ap.error(f"--rank {a.rank} outside [0, {ranks}) (ranks_per_group in --config)")
    if cfg.device.startswith("cuda"):  # one GPU a process, before any CUDA context or NCCL
        cfg = replace(cfg, device=cfg.local_device(a.uid, a.rank, torch.cuda.device_count()))
        torch.cuda.set_device(torch.device(cfg.device))
    os.makedirs(a.journal, exist_ok=True)
    comm = runner = reattach = None
    code = 0
    # rank 0 writes the group's journal (the one the supervisor reads); the others their own
    name = f"group-{a.uid}.jsonl" if a.rank == 0 else f"rank-{a.uid}.{a.rank}.jsonl"
    jf = open(os.path.join(a.journal, name), "a", buffering=1)
    jlock = threading.Lock()  # the health agent's thread journals too

    def journal(ev: dict) -> None:
        with jlock:
            jf.write(json.dumps(ev) + "\n")  # line-buffered: in the kernel before the next step

    plugin = None
    if a.plugin is not None:
        from unbroken.runtime.hooks import load_plugin

        try:
            plugin = load_plugin(a.plugin, json.loads(a.plugin_args), a.uid, cfg)
        except ValueError as e:  # json's own error is a ValueError too
            ap.error(str(e))
    try:
        store = dist.TCPStore(a.host, a.port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=60))
        trainer = group = None
        if ranks > 1:  # the group's own process group, its mesh, the model sharded over it
            trainer, group = _group(cfg, a.uid, a.rank, store)
        comm = FTComm(a.uid, list(range(cfg.groups)), store=store,
                      heartbeat_period=a.heartbeat, staleness=a.staleness,
                      pg_timeout=a.pg_timeout, joining=a.standby, backend=cfg.backend,
                      supervisor_staleness=a.supervisor_staleness, rank=a.rank, ranks=ranks)
        comm.on_fence = journal  # a rank that fences its group says why before it exits
        if a.etcd:  # outlive the supervisor: re-attach to the standby's store
            from unbroken.runtime.reattach import Reattach

            reattach = Reattach(a.etcd, a.job)
            reattach.learn(store)
            reattach.connect_ahead()
        if cfg.sync == "sync":  # today's runner; the modes' imports (scipy's clustering,
            make_runner = StackedRunner  # ~0.8 s on a loaded machine) are not paid for
        else:
            from unbroken.runtime.syncmodes import make_runner
        runner = make_runner(cfg, a.uid, plugin.wrap_comm(comm) if plugin else comm, journal,
                             hooks=plugin.hooks if plugin else None,
                             wipeout_wait=a.wipeout_wait, ckpt_dir=a.ckpt_dir,
                             ckpt_every=a.ckpt_every, verdicts=a.verdicts, trainer=trainer,
                             group=group)
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
            try:
                comm.store.wait([assign_key(a.uid)], timedelta(hours=24))
            except Exception:
                if reattach is not None:  # its coordinator is gone; the next one has its own
                    hard_exit(ExitCode.COORDINATOR_LOST)
                raise
            if plugin is not None:
                plugin.assigned(runner)
            start_health()
            runner.join(int(comm.store.get(assign_key(a.uid))))
        else:
            start_health()
        params = _train(runner, comm, reattach, a, journal)
        if ranks > 1:  # the whole model's parameters (a collective over the group)
            params = runner.trainer.full_params()
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
    if reattach is not None and comm is not None:  # an adopting supervisor is not our
        try:  # parent: it cannot waitpid
            comm.store.set(exit_key(a.uid, a.rank), str(int(code)))
        except Exception:
            pass
    hard_exit(code)


def _train(runner, comm, reattach, a, journal):
    """``runner.run()``; with ``reattach`` (``--etcd``), a lost coordinator is waited out:
    every member stopped after the same committed step, rank 0 checkpoints it (the fallback),
    each re-attaches to the store of the supervisor that took the lease over and, once
    adopted, trains on from that step (``runtime.reattach``). A member whose step failed as
    the store went (a peer died with the supervisor: the re-form found no store) re-attaches
    the same way, at its last committed step, and its re-entered step re-forms in the
    standby's store without the peer (one commit behind peers whose op completed: that
    re-form's settle rolls it forward). No new coordinator in time: the
    ``CoordinatorLostError`` goes on (exit 5 with the checkpoint)."""
    from unbroken.runtime.ftcomm import StoreLostError
    from unbroken.runtime.reattach import ReattachFailed, report
    from unbroken.runtime.stacked import CoordinatorLostError

    while True:
        try:
            return _profiled(runner.run, a.uid)
        except (CoordinatorLostError, StoreLostError):
            if reattach is None:
                raise
            t0 = time.time()
            path = runner.save_checkpoint_now()
            t_saved = time.time()
            try:
                store = reattach.connect(*reattach.wait(a.reattach_timeout))
                comm.reattach(store, reattach.hb_client)
                runner.reattached(store)
                report(store, a.uid, runner, a.reattach_timeout, t0, rank=a.rank, node=a.node)
            except (ReattachFailed, RuntimeError) as exc:  # torch's connect errors too
                raise CoordinatorLostError(f"no takeover: {exc}") from None
            if a.node is not None:  # the standby may fence the node as its predecessor could
                _fence(store, a.node)
            journal({"event": Event.ADOPTED, "step": runner.step, "checkpoint": path,
                     "waited_s": round(time.time() - t0, 3),
                     "checkpoint_s": round(t_saved - t0, 3),
                     "ahead": reattach.hb_client is not None,
                     "reattach_timeout": a.reattach_timeout, "t": time.time()})


def _group(cfg, uid: int, rank: int, store):
    """Rank ``rank`` of group ``uid``: torch's default process group over the group's ranks
    (its own store prefix, so a spare group forms its own), the (dp_group, shard) mesh on it,
    and the trainer sharded over it (``unbroken.runtime.sharding``)."""
    import torch.distributed as dist

    from unbroken.runtime.groupsync import GroupSync
    from unbroken.runtime.sharding import ShardedTrainer, group_mesh
    from unbroken.runtime.trainer import make_trainer

    ranks = cfg.ranks_per_group
    # on GPUs the model's collectives (FSDP's, TP's) go over NCCL and the group's small
    # per-step agreement (CPU tensors: GroupSync) over gloo, one default group for both
    backend = "cpu:gloo,cuda:nccl" if cfg.backend == "nccl" else cfg.backend
    dist.init_process_group(backend, store=dist.PrefixStore(group_pg_prefix(uid), store),
                            rank=rank, world_size=ranks)
    return (ShardedTrainer(make_trainer(cfg), cfg.shard, group_mesh(ranks, cfg.device)),
            GroupSync(rank, ranks))


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


if __name__ == "__main__":
    worker_main()
