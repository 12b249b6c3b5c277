"""The local launcher of a stacked job: hosts the store and starts every group's worker
(:mod:`unbroken.runtime.stacked_worker`) and its warm spares as processes on this machine.

The supervisor's attempts run on it (``supervise.attempt.make_cluster``), node agents extend
it (:class:`unbroken.nodes.cluster.NodeCluster`), and the tests and benchmarks drive it
directly. It is where a run's faults are turned into the workers' fault plug-in
(:mod:`unbroken.testing.faults`, named by :data:`FAULT_PLUGIN`): the runtime itself holds no
fault code and imports none unless a launcher names the plug-in.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta

from unbroken.protocol import assign_key, drill_key, rank_proc
from unbroken.runtime.ftcomm_worker import LocalCluster
from unbroken.supervise.rankgroup import RankGroup

__all__ = ["StackedCluster", "FAULT_PLUGIN"]

#: the workers' fault-injection plug-in (``--plugin``), named only when a run injects faults
FAULT_PLUGIN = "unbroken.testing.faults:install"


def start_store_host(stderr_path: str):
    """A coordinator store in a process of its own (``runtime.store_host``), forked from the
    warm server: ``(its handle, its port)``."""
    from unbroken import spawn

    host = spawn.start("unbroken.runtime.store_host:main", [], stderr_path=stderr_path,
                       channel=True)
    try:
        return host, int(host.receive(timeout=120))
    except (TimeoutError, EOFError):
        try:
            with open(stderr_path, "rb") as f:
                err = f.read().decode(errors="replace")[-500:]
        except FileNotFoundError:
            err = ""
        raise RuntimeError(f"the store host did not start (rc {host.poll()}): {err}") from None


class StackedCluster(LocalCluster):
    """``LocalCluster`` that starts stacked training workers (uids ``0..groups-1``) and
    ``spares`` warm standby processes (uids ``groups..``) that join when assigned a slot.

    Faults (see :class:`unbroken.testing.faults.FaultSpec`): ``die_at`` / ``stop_at`` /
    ``drop_commit_at`` ...: uid -> step; ``die_after_replan``, ``die_in_patch``,
    ``die_in_retry``, ``corrupt_snapshot``, ``drop_commit_on_join``: uids;
    ``drop_commit_hold_s``: a dropped commit then waits that long for the store to go (see
    ``DropCommit``); ``pace_s``: every process's gradients take at least that long (a test's
    job that lasts without keeping the cores busy); ``drill``: uid ->
    its slot's scheduled faults ``[(kind, step), ...]`` (``core.faults.holder_faults``; the
    supervisor's route). When any is given, or the config has a straggler trace, every
    process of the cluster (a spare started later too: it may be sent into a faulty slot)
    gets the fault plug-in with its own share; otherwise none does.
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
                 drop_commit_on_join=(), drop_commit_hold_s: float = 0.0, pace_s: float = 0.0,
                 spares: int = 0, heartbeat: float = 0.1, staleness: float = 0.3,
                 pg_timeout: float = 30.0, wipeout_wait: float = 60.0,
                 ckpt_dir: str | None = None, ckpt_every: int = 50, resume: bool = False,
                 store_port: int | None = None, store_process: bool = False,
                 fault_rank: dict[int, int] | None = None,
                 supervisor_staleness: float = 0.0, extra_argv: list[str] = (),
                 adopt_from: int | None = None, store_host=None, store_client=None) -> None:
        """``extra_argv``: more worker flags (``--etcd URL --job NAME``). ``adopt_from``: a
        standby's cluster: the members are adopted later (:meth:`adopt`), not started, and
        the spares' uids begin there (past every uid the job used). ``store_host``: a store
        host started earlier (:func:`start_store_host`, a standby's) at ``store_port``; this
        cluster owns it from now on; ``store_client``: a client of it connected then."""
        import torch.distributed as dist

        self.cfg = cfg
        self.uids: list[int] = []
        first = cfg.groups if adopt_from is None else adopt_from
        self.spares = list(range(first, first + spares))
        self.journal_dir = journal_dir
        self._init_procs()
        self.store_host = store_host
        if store_process and store_port is None:  # the store outlives a stopped launcher
            self.store_host, store_port = start_store_host(self._errpath("store"))
        if store_port is None:  # host the store here: the launcher is the coordinator
            from unbroken.runtime.store_host import serve_store

            self.store = serve_store()
        elif store_client is not None:
            self.store = store_client
        else:  # a store hosted elsewhere (a test kills it to play a dead coordinator)
            self.store = dist.TCPStore("127.0.0.1", store_port, is_master=False,
                                       wait_for_workers=False, timeout=timedelta(seconds=10))
        self.port = self.store.port
        # _lost_notice's client, opened before any worker runs (a connection opened while the
        # box trains can stall torch's TCPStore, ``runtime.ftcomm_heartbeat``)
        self._notice_store = self.store.clone() if cfg.ranks_per_group > 1 else None
        self._notice_lock = threading.Lock()
        self._common = ["--port", str(self.port), "--config", cfg.to_json(),
                        "--journal", journal_dir, "--heartbeat", str(heartbeat),
                        "--staleness", str(staleness), "--pg-timeout", str(pg_timeout),
                        "--wipeout-wait", str(wipeout_wait), "--ckpt-every", str(ckpt_every),
                        *(["--ckpt-dir", ckpt_dir] if ckpt_dir else []),
                        *(["--resume"] if resume else []),
                        *(["--supervisor-staleness", str(supervisor_staleness)]
                          if supervisor_staleness > 0 else []),
                        *(["--verdicts"] if verdicts else []), *extra_argv]
        flags = {"die_after_replan": die_after_replan, "die_in_patch": die_in_patch,
                 "die_in_retry": die_in_retry, "corrupt_snapshot": corrupt_snapshot,
                 "drop_commit_on_join": drop_commit_on_join}
        steps = {"die_at": die_at or {}, "stop_at": stop_at or {},
                 "drop_commit_at": drop_commit_at or {}, "slow_from": slow_from or {},
                 "stall_at": stall_at or {}, "nan_at": nan_at or {},
                 "flip_from": flip_from or {}}
        self._faults: dict[int, dict] = {}
        self._fault_rank = dict(fault_rank or {})
        for u in [*self.spares, *range(cfg.groups)]:
            f = {k: True for k, us in flags.items() if u in us}
            f.update({k: m[u] for k, m in steps.items() if u in m})
            if drill and drill.get(u):
                f["drill"] = [list(x) for x in drill[u]]
            if "drop_commit_at" in f or "drop_commit_on_join" in f:  # it fails its op once
                # the peers committed that step (on a loaded machine at once could be too early)
                f["peers_journal"] = journal_dir
                if drop_commit_hold_s > 0:
                    f["drop_commit_hold_s"] = drop_commit_hold_s
            if pace_s > 0:
                f["pace_s"] = pace_s
            if f:
                self._faults[u] = f
        self._inject = bool(self._faults) or bool(drill) or cfg.stragglers is not None
        # spares first: a spare started after the members competes for the cores with a job
        # already training (all of it one scheduling group, ``unbroken.spawn``), and at 16
        # groups one took 4 s to be ready, too late for the run that needed it
        for u in [*self.spares, *(range(cfg.groups) if adopt_from is None else ())]:
            self.spawn(u, standby=u in self.spares)

    def adopt(self, members, pids: dict[int, list[int]], nodes=None) -> None:
        """Take over running members started by another supervisor (``supervise.adopt``):
        ``pids[uid]``, its ranks' pids in rank order; one without pids never re-attached and
        is handed over as dead. A group of several ranks is a :class:`RankGroup` again (one
        rank's failure fences it, the death notice first). ``nodes``: for node agents only
        (``NodeCluster.adopt``); these are this machine's children's children."""
        from unbroken.supervise.adopt import AdoptedProc

        ranks = self.cfg.ranks_per_group
        for u in members:
            got = pids.get(u) or [None] * ranks
            procs = [AdoptedProc(pid, u, self.store, rank=k) for k, pid in enumerate(got)]
            self.procs[u] = procs[0] if ranks == 1 else RankGroup(
                procs, on_lost=lambda u=u: self._lost_notice(u))
            self.uids.append(u)

    def drop_paused(self, reports: dict[int, dict]) -> None:
        """Nothing adopted: the members that re-attached (``reports``, paused at a boundary)
        are stopped here by pid; the restart from the checkpoint replaces them."""
        from unbroken.supervise.adopt import stop_paused

        stop_paused(reports)

    def spawn(self, uid: int, *, standby: bool = False, extra: list[str] = ()) -> None:
        """Start worker ``uid`` (a warm spare with ``standby``): one process, or a group of
        ``ranks_per_group`` (``procs[uid]`` is then their :class:`RankGroup`). It dies with
        this launcher while it starts up (:mod:`unbroken.spawn`) and sits in a process group
        of its own, so a terminal's Ctrl-C reaches the launcher only. A group's faults go to
        its rank ``fault_rank[uid]`` (0 by default)."""
        ranks = self.cfg.ranks_per_group
        procs = []
        for k in range(ranks):
            argv = ["--uid", str(uid), *self._common, *(["--standby"] if standby else []),
                    *extra]
            if ranks > 1:
                argv += ["--rank", str(k)]
            if self._inject:
                mine = k == self._fault_rank.get(uid, 0)
                argv += ["--plugin", FAULT_PLUGIN, "--plugin-args",
                         json.dumps({**(self._faults.get(uid, {}) if mine else {}),
                                     **({"rank": k} if ranks > 1 else {})})]
            key = rank_proc(uid, k, ranks)
            self._start(key, "unbroken.runtime.stacked_worker:worker_main", argv)
            procs.append(self.procs.pop(key) if ranks > 1 else self.procs[uid])
        if ranks > 1:
            self.procs[uid] = RankGroup(procs, on_lost=lambda: self._lost_notice(uid))
        self.uids.append(uid)
        if standby and uid not in self.spares:
            self.spares.append(uid)

    def _lost_notice(self, uid: int) -> None:
        """Group ``uid`` lost a rank: its death notice, posted as the loss is found, before its
        other ranks are killed and reaped (``RankGroup``), so the survivors re-form meanwhile.
        A client of its own: a group's status may be polled from another thread (a hung
        member's dump-then-kill)."""
        from unbroken.runtime.ftcomm import declare_dead

        with self._notice_lock:
            declare_dead(self._notice_store, uid)

    def assign(self, spare: int, slot: int, drill: list[tuple[str, int]] = ()) -> None:
        """Send a warm spare to take over layout ``slot`` (it joins at the next step boundary,
        or at once when the survivors are waiting for it after a wipe-out); ``drill``: the
        slot's next scheduled faults, which it injects."""
        if drill:
            self.store.set(drill_key(spare), json.dumps([list(f) for f in drill]))
        self.store.set(assign_key(spare), str(slot))

    def stderr(self, uid: int) -> str:
        """Worker ``uid``'s stderr (every rank's, in rank order, for a group of several)."""
        if self.cfg.ranks_per_group == 1:
            return super().stderr(uid)
        one = super().stderr
        return "".join(f"--- rank {k}:\n" + one(rank_proc(uid, k, self.cfg.ranks_per_group))
                       for k in range(self.cfg.ranks_per_group))

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
