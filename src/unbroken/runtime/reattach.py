"""A worker outlives its supervisor: find the new coordinator's store in etcd and re-attach.

Why: with ``--store etcd://`` the supervisor's host is no longer the job's single point of
failure (``supervise.coordinated``), but the workers' state is in their memory. A standby
supervisor that restarted them from the last checkpoint would lose what they computed since
and pay a full start-up. So a worker started with ``--etcd URL --job NAME`` does not exit when
its store goes away:

1. every member stops after the same committed step (the step buffer's ``LOST`` flag,
   ``runtime.stacked``) -- a boundary all of them agree on, so no state copy is needed later;
   rank 0 writes a durable checkpoint of it, the fallback if no supervisor comes. (A peer
   that died mid-all-reduce with the supervisor can leave a member one commit behind the
   others; the standby adopts it anyway and its first settle rolls it forward:
   ``core.coordination.adoption``);
2. each member watches the job's ``store_addr`` in etcd (:class:`Reattach`) until a record
   with another epoch than its own store's appears: the standby that took the lease hosts a
   new store and published it there;
3. it connects (each waiting standby announces its store in etcd, and the members connect to
   it ahead: :meth:`Reattach.connect_ahead`), moves its communicator onto it (``FTComm.reattach``: new heartbeat, same
   generation and process group -- gloo's pairs never went through the store) and posts its
   report (:func:`report`: uid, pid, slot, step, generation, members), the standby's whole
   view of the running job;
4. it waits for the standby's go (``protocol.ADOPTED``: the uids adopted) and trains on from
   the same step -- or, not named there (it reported after the standby's adopt timeout and
   was adopted as lost, its slot replaced), leaves with exit 5: a late reporter is fenced.

Latency budget: etcd's watch wakes a member within milliseconds of the publication; the rest
is the lease's TTL (the standby waits it out): the connects were made ahead. While a supervisor
is alive a member holds one idle etcd watch (on ``standbys/``): the hot path is unchanged.

Exit code contract: no new store within ``timeout`` s, or no go within ``timeout`` s after the
report: the caller exits 5 as before (its checkpoint is on disk, ``--resume`` continues).
A group of several ranks stops as one (its ranks agree on the lost coordinator, the group's
checkpoint is written together); each rank re-attaches its own plane's communicator and posts
its own report, and the standby adopts the group only when all of its ranks reported.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

from unbroken.protocol import ADOPTED, COORD_EPOCH, reattach_key

__all__ = ["Reattach", "report", "ReattachFailed"]


class ReattachFailed(Exception):
    """No new coordinator in time (the caller exits 5 with its checkpoint)."""


class Reattach:
    """The etcd record of job ``job`` that names its coordinator's store (``store_addr``:
    host, port, epoch), read with the stdlib client of ``unbroken.coord.etcd``."""

    RETRY_S = 0.25  # etcd down: 16 members retrying every 50 ms kept a 2-core etcd too busy

    def __init__(self, url: str, job: str) -> None:
        from unbroken.coord.etcd import Etcd
        from unbroken.core.coordination import job_prefix, parse_store

        self.endpoints = list(parse_store(url).endpoints)
        self.etcd = Etcd(self.endpoints, timeout=1.0)
        self.key = job_prefix(job) + "store_addr"
        self.standbys = job_prefix(job) + "standbys/"
        self.epoch: str | None = None  # the epoch of the store this worker is attached to
        # (host, port) of a standby's store -> (client, heartbeat's client), connected ahead
        self._ahead: dict[tuple[str, int], tuple] = {}
        self._lock = threading.Lock()
        self.hb_client = None  # the heartbeat's client of the store connect() returned

    def connect_ahead(self) -> None:
        """Connect to each waiting standby's store as it announces it (``standbys/<name>`` in
        etcd, watched by a daemon thread), so that a takeover costs no connect. Why: torch's
        TCPStore client looks its own v4-mapped address up in DNS at each connect
        (``formatSockAddr`` -> ``getnameinfo``; ``/etc/hosts`` does not answer it), and a
        dropped query held a re-attaching member 1-2 s (16 groups, 2 connects a member)."""
        threading.Thread(target=self._ahead_loop, name="reattach-ahead", daemon=True).start()

    def _ahead_loop(self) -> None:
        from unbroken.coord.etcd import Etcd, EtcdError

        etcd = Etcd(self.endpoints, timeout=1.0)  # a client of its own (this thread's)
        while True:
            try:
                kvs, rev = etcd.get_prefix_at(self.standbys)
            except EtcdError:
                time.sleep(self.RETRY_S)  # etcd down: a retry interval, not a synchronisation
                continue
            announced = set()
            for kv in kvs:
                try:
                    st = json.loads(kv.value).get("store") or {}
                    announced.add((str(st["host"]), int(st["port"])))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # an announcement without a store (an older standby)
            with self._lock:  # a standby gone: its store too (its port may be reused)
                self._ahead = {a: k for a, k in self._ahead.items() if a in announced}
            for addr in sorted(announced):
                with self._lock:
                    if addr in self._ahead:
                        continue
                try:
                    kit = (self._client(*addr), self._client(*addr))
                except RuntimeError:  # it went away meanwhile: the next read drops it
                    continue
                with self._lock:
                    self._ahead[addr] = kit
            etcd.watch(self.standbys, rev + 1, 30.0, prefix=True)

    @staticmethod
    def _client(host: str, port: int):
        import torch.distributed as dist

        return dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=60))

    def learn(self, store) -> None:
        """The epoch of ``store`` (its supervisor sets ``COORD_EPOCH`` right after creating
        it; a worker may be quicker, so this waits for it)."""
        self.epoch = store.get(COORD_EPOCH).decode()

    def wait(self, timeout: float) -> tuple[str, int, str]:
        """Block until etcd names a store of another epoch: (host, port, epoch)
        (``coord.follow``: a read, then a watch that etcd answers at the publication)."""
        from unbroken.coord.follow import wait_new_epoch

        rec = wait_new_epoch(self.etcd, self.key, self.epoch, timeout)
        if rec is None:
            raise ReattachFailed(f"no new coordinator in etcd within {timeout:g}s")
        return str(rec["host"]), int(rec["port"]), str(rec["epoch"])

    def connect(self, host: str, port: int, epoch: str):
        """A client of the new store: the one connected ahead if there is (its heartbeat's
        client then in :attr:`hb_client`), else a fresh one."""
        with self._lock:
            kit = self._ahead.pop((host, port), None)
        store, self.hb_client = kit if kit is not None else (self._client(host, port), None)
        self.epoch = epoch
        return store


def report(store, uid: int, runner, timeout: float, stopped_t: float, rank: int = 0,
           node: int | None = None) -> None:
    """Post this member's view (the standby adopts from these; each rank of a group posts
    its own), then wait for the go. ``stopped_t``: when it stopped training (the standby
    reports the pause); ``node``: the node agent that started it (its parent, which reports
    its exit to the standby), None for the supervisor's own child."""
    comm = runner.comm
    store.set(reattach_key(uid, rank), json.dumps({
        "uid": uid, "rank": rank, "pid": os.getpid(), "node": node,
        "slot": runner.slot_of.get(uid),
        "step": runner.step,
        "gen": comm.generation, "members": comm.members,
        "slot_of": {str(u): s for u, s in runner.slot_of.items()}, "stopped_t": stopped_t,
        "t": time.time()}))
    try:
        store.wait([ADOPTED], timedelta(seconds=timeout))
        adopted = json.loads(store.get(ADOPTED))
    except Exception as exc:
        raise ReattachFailed(f"the new coordinator did not adopt this member within "
                             f"{timeout:g}s") from exc
    if uid not in adopted:  # fenced: it came after the standby's adopt timeout
        raise ReattachFailed(f"the new coordinator adopted {adopted} without this member "
                             f"(it reported after the adopt timeout): it was replaced")
