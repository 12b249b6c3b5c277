"""The job's durable coordination state, in etcd: identity, leadership, generation, watermark.

Why etcd: the supervisor's host is a single point of failure when the job's state lives in its
TCPStore. In etcd (replicated, Raft) the state survives that host, and etcd's leases and
transactions give leadership and fencing without a consensus of our own.

Layout, one job per prefix ``/unbroken/<job>/`` (``core.coordination.job_prefix``):

==============  ===========================================================================
``spec``        the job's identity (JSON); a prefix holding another job is refused
``leader``      the acting supervisor's name, attached to its lease (gone when it expires)
``status``      ``running`` | ``done``
``generation``  the current generation (an integer)
``members``     the generation's members (JSON), ``plan`` its plan (JSON)
``committed``   the committed-step watermark (``generation:step``), at checkpoint and
                generation boundaries only: nothing on the per-step hot path writes here
``spares``      the warm pool (uids, their pids) at each change; emptied at the end
``exclusions``  the guard's eviction history (``core.exclusion.records_json``): a standby
                that takes over restores it, so quarantined nodes stay quarantined
``ledger_head``, ``store_addr``  (JSON / text) as named
``directory``   the node directory's address and epoch (``--nodes``): where agents started
                with ``--store`` claim their node, the standby's after a takeover
``standbys/*``  each waiting standby (its name: pid, host, since), under a lease of its own:
                an operator sees which warm standbys the job has; a dead one's key expires
==============  ===========================================================================

Failure semantics: every supervisor write (:meth:`EtcdJobState.write`,
:meth:`advance_generation`) is one transaction guarded by "the leader key is still the one I
created": a supervisor whose lease expired (stopped, partitioned, deposed by a standby) gets
:class:`NotLeader` and writes nothing, whatever it believes. A watermark
(:meth:`commit`) is a transaction guarded by the generation key's and the watermark's
revisions as read, so it lands only if :func:`core.coordination.may_commit` said yes about the
values that are still current. Without quorum every call raises ``EtcdUnavailable``: nothing
is written, the caller pauses and retries (:func:`retry_until`).
"""

from __future__ import annotations

import json
import time
from typing import Callable, TypeVar

from unbroken.coord.etcd import (Etcd, EtcdUnavailable, cmp_create, cmp_mod, cmp_value, op_get,
                                 op_put, range_kvs)
from unbroken.core.coordination import job_prefix, may_act, may_commit, same_job, takeover

__all__ = ["EtcdJobState", "NotLeader", "OtherJob", "retry_until", "FIELDS"]

FIELDS = ("status", "generation", "members", "plan", "committed", "spares", "exclusions",
          "ledger_head", "store_addr", "directory")

T = TypeVar("T")


class NotLeader(Exception):
    """This supervisor does not hold the lease: it must not act (the reason says whose it is)."""


class OtherJob(Exception):
    """The prefix holds another job (one line)."""


class EtcdJobState:
    """``EtcdJobState(etcd, job, me)``: job ``job``'s state, as seen by participant ``me``."""

    def __init__(self, etcd: Etcd, job: str, me: str) -> None:
        self.etcd, self.job, self.me = etcd, job, me
        self.prefix = job_prefix(job)
        self.lease = 0
        self.revision = 0  # the creation revision of the leader key when this one made it
        self.read_revision = 0  # the cluster's revision at the last read()
        self._standby: tuple[dict, int] | None = None  # what announce() said, and its TTL
        self._standby_lease = 0

    def key(self, name: str) -> str:
        return self.prefix + name

    # ------------------------------------------------------------------ identity
    def claim_job(self, identity: dict) -> str:
        """Record ``identity`` under a free prefix, or check it is the one recorded there;
        :class:`OtherJob` when the prefix holds another job."""
        text = json.dumps(identity, sort_keys=True)
        ok, resp, _ = self.etcd.txn([cmp_create(self.key("spec"), 0)],
                                    [op_put(self.key("spec"), text)], [op_get(self.key("spec"))])
        if ok:
            return "the prefix is free: this job claimed it"
        stored = range_kvs(resp[0])
        same, why = same_job(json.loads(stored[0].value) if stored else None, identity)
        if not same:
            raise OtherJob(f"{self.prefix}: {why}")
        return why

    # ------------------------------------------------------------------ leadership
    def leader(self) -> tuple[str, int] | None:
        kv = self.etcd.get(self.key("leader"))
        return (kv.value, kv.create_revision) if kv is not None else None

    def acquire(self, ttl: int) -> tuple[bool, str]:
        """Try to become the leader under a fresh lease of ``ttl`` s (create-if-absent)."""
        lease = self.etcd.grant(ttl)
        ok, resp, rev = self.etcd.txn([cmp_create(self.key("leader"), 0)],
                                      [op_put(self.key("leader"), self.me, lease)],
                                      [op_get(self.key("leader"))])
        if not ok:
            self.etcd.revoke(lease)
            held = range_kvs(resp[0])
            return False, f"supervisor {held[0].value if held else '?'} holds the lease"
        self.lease, self.revision = lease, rev
        return True, f"{self.me} holds the lease (revision {rev}, ttl {ttl} s)"

    def acting(self) -> tuple[bool, str]:
        """``core.coordination.may_act`` on the leader key as etcd has it now."""
        return may_act(self.leader(), self.me, self.revision)

    def release(self) -> None:
        """Give the lease up at once (a clean exit): a standby need not wait for its TTL."""
        if self.lease:
            self.etcd.revoke(self.lease)
            self.lease = 0

    # ------------------------------------------------------------------ standbys
    def announce(self, info: dict, ttl: int) -> None:
        """Say this standby waits, warm (``standbys/<me>``, gone ``ttl`` s after its last
        :meth:`still_here`, or at :meth:`withdraw`)."""
        self._standby = (info, ttl)
        self._standby_lease = self.etcd.grant(ttl)
        self.etcd.put(self.key("standbys/" + self.me), json.dumps(info), self._standby_lease)

    def still_here(self) -> None:
        if self._standby_lease and self.etcd.keepalive(self._standby_lease) <= 0:
            self.announce(*self._standby)  # it lapsed (etcd was away longer than its TTL)

    def withdraw(self) -> None:
        if self._standby_lease:
            self.etcd.revoke(self._standby_lease)
            self._standby_lease = 0

    def standbys(self) -> dict[str, dict]:
        pre = self.key("standbys/")
        return {kv.key[len(pre):]: json.loads(kv.value) for kv in self.etcd.get_prefix(pre)}

    def _guard(self) -> list[dict]:
        if not self.revision:  # never held the lease: nothing to guard, nothing to write
            raise NotLeader(f"{self.me} never held the lease: not acting")
        return [cmp_create(self.key("leader"), self.revision),
                cmp_value(self.key("leader"), self.me)]

    def write(self, **fields: object) -> None:
        """Write ``fields`` (names in :data:`FIELDS`) in one transaction, only as the leader."""
        bad = sorted(set(fields) - set(FIELDS))
        if bad:
            raise KeyError(f"not a job state field: {bad}")
        puts = [op_put(self.key(k), v if isinstance(v, str) else json.dumps(v))
                for k, v in fields.items()]
        ok, _, _ = self.etcd.txn(self._guard(), puts)
        if not ok:
            raise NotLeader(self.acting()[1])

    def advance_generation(self, members: list, plan: object) -> int:
        """Open the next generation (the leader only): its number. Watermarks of older
        generations are refused from here on (:meth:`commit`)."""
        guard = self._guard()
        kv = self.etcd.get(self.key("generation"))
        gen = int(kv.value) + 1 if kv is not None else 1
        ok, _, _ = self.etcd.txn(
            guard + [cmp_mod(self.key("generation"), kv.mod_revision if kv is not None else 0)],
            [op_put(self.key("generation"), str(gen)),
             op_put(self.key("members"), json.dumps(members)),
             op_put(self.key("plan"), json.dumps(plan))])
        if not ok:
            raise NotLeader(self.acting()[1])
        return gen

    # ------------------------------------------------------------------ fencing
    def generation(self) -> int:
        kv = self.etcd.get(self.key("generation"))
        return int(kv.value) if kv is not None else 0

    def committed(self) -> tuple[int, int]:
        """(generation, step) of the watermark; (0, -1) before the first."""
        kv = self.etcd.get(self.key("committed"))
        if kv is None:
            return 0, -1
        g, _, s = kv.value.partition(":")
        return int(g), int(s)

    def commit(self, generation: int, step: int) -> tuple[bool, str]:
        """Record the watermark ``step`` of ``generation`` if it may be (generation fencing,
        forwards only): ``(done, reason)``. Atomic against a concurrent generation change."""
        gkv, ckv = self.etcd.get(self.key("generation")), self.etcd.get(self.key("committed"))
        current = int(gkv.value) if gkv is not None else 0
        top = int(ckv.value.partition(":")[2]) if ckv is not None else -1
        ok, why = may_commit(generation, current, step, top)
        if not ok:
            return False, why
        done, _, _ = self.etcd.txn(
            [cmp_mod(self.key("generation"), gkv.mod_revision if gkv else 0),
             cmp_mod(self.key("committed"), ckv.mod_revision if ckv else 0)],
            [op_put(self.key("committed"), f"{generation}:{step}")])
        if not done:  # the generation or the watermark moved meanwhile: decide again
            return self.commit(generation, step)
        return True, why

    # ------------------------------------------------------------------ reading
    def read(self) -> dict:
        """Every field as stored (JSON decoded where it is JSON), one consistent range read."""
        out: dict = {}
        kvs, self.read_revision = self.etcd.get_prefix_at(self.prefix)
        for kv in kvs:
            if kv.key.startswith(self.key("standbys/")):
                continue  # not the job's state (standbys())
            name = kv.key[len(self.prefix):]
            try:
                out[name] = json.loads(kv.value)
            except ValueError:
                out[name] = kv.value
        return out

    def standby_move(self) -> tuple[str, str]:
        """``core.coordination.takeover`` on what etcd holds now."""
        st = self.read()
        return takeover(st.get("leader"), st.get("status"))


def retry_until(call: Callable[[], T], deadline: float, pause: float = 0.05,
                on_wait: Callable[[str], None] | None = None) -> T:
    """``call()`` until it does not raise ``EtcdUnavailable`` (no quorum: pause, do not
    guess) or ``deadline`` (monotonic) passes, when the last error is raised."""
    told = False
    while True:
        try:
            return call()
        except EtcdUnavailable as e:
            if time.monotonic() >= deadline:
                raise
            if on_wait is not None and not told:
                on_wait(str(e))
                told = True
            time.sleep(pause)  # a retry interval against a down cluster, not a synchronisation
