"""The rendezvous of :class:`~unbroken.runtime.ftcomm.FTComm`: agree in the store on the members
of generation g+1 (survivors and admitted joiners) and build its process group.

* ``reform()`` runs a rendezvous for generation ``g+1`` in the store: the first member to count
  itself in leads; it publishes the member list once every member with a fresh heartbeat has
  joined and every joiner the members expect has registered (or been declared dead), or at a
  deadline. After a gloo connection error, which means a peer *process* is gone, "fresh" is a
  few heartbeat periods instead of ``staleness`` (``core.membership.rendezvous_staleness``).
  Whoever joins is kept, even if a starved heartbeat made it look stale.
* Each member then destroys the old default group and calls ``init_process_group("gloo",
  store=PrefixStore(f"pg/{g+1}", store), ...)`` with the new world. Pairs connect on first use
  (``TORCH_GLOO_LAZY_INIT``), so a re-form costs O(1) connections per member, not gloo's full
  mesh; a member lost between the rendezvous and its first op is then found like any dead or
  silent member, in the op -- or, sooner, while the members wait for each other's group
  (``_await_members``), on the heartbeat's judgement.
* Each member's ``offer`` rides on the rendezvous records, so the training loop's settle needs
  no collective of its own on the new group.

Every store call here is on the caller's client, in the caller's thread: no connection of its
own (a connection per re-form is what stalled torch's TCPStore at 32 members). The store keys
(``rdzv/<g>/count``, ``/joined/<n>``, ``/joiner/<uid>``, ``/members``, ``/built/<uid>`` and
the groups' ``pg/<g>/`` prefix) are private to this module.

:class:`Rendezvous` knows nothing of the current generation or its abort flag: ``FTComm.reform``
and ``FTComm.join`` switch generations around it. It asks its owner only who is live now.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from unbroken.protocol import DEAD_EPOCH, dead_key
from unbroken.core.membership import (
    LEADER_SILENCE,
    generation_reports,
    leader_gone,
    leader_look_s,
    next_members,
    rendezvous_ready,
    rendezvous_staleness,
)
from unbroken.runtime.ftcomm_heartbeat import gloo_error_key

__all__ = ["Rendezvous", "RendezvousError", "StoreLostError", "LAZY_INIT_ENV", "new_backend"]

#: gloo's switch for connecting a pair of ranks on its first use instead of at group creation
LAZY_INIT_ENV = "TORCH_GLOO_LAZY_INIT"


class RendezvousError(RuntimeError):
    """The next generation could not be formed (timeout, or this worker was left out)."""


class StoreLostError(RuntimeError):
    """The coordinator's store stopped answering (the coordinator died)."""


class Rendezvous:
    """Member ``uid``'s side of every rendezvous, over ``store`` (the caller's client).

    ``live(staleness=None)``: the members the heartbeat judges live now; ``staleness()``: the
    silence it tolerates now (both the owner's). ``graveyard``: where a destroyed default
    group is kept (gloo threads may still touch it). ``stop``: set when the owner closes.
    """

    def __init__(self, uid: int, store: Any, *, backend: str, heartbeat_period: float,
                 staleness: float, rendezvous_timeout: float, init_timeout: float,
                 pg_timeout: float, live: Callable[..., list[int]],
                 judging_staleness: Callable[[], float], graveyard: list,
                 stop: threading.Event, ns: str = "") -> None:
        self.uid = uid
        self.store = store
        self.backend = backend
        self.heartbeat_period = heartbeat_period
        self.staleness = staleness
        self.rendezvous_timeout = rendezvous_timeout
        self.init_timeout = init_timeout
        self.pg_timeout = pg_timeout
        self._live = live
        self._staleness = judging_staleness
        self._graveyard = graveyard
        self._stop = stop
        self.ns = ns  # the plane's key namespace (protocol.plane_ns)
        self.pg: Any = None  # the generation's process group (init_pg)
        # what this member tells the others in the next rendezvous (offer()), and what every
        # member of the last one told: (generation, {uid: report}); None: not all of them did
        self._offer: Any = None
        self.reports: tuple[int, dict[int, Any]] | None = None

    def offer(self, report: Any) -> None:
        self._offer = report

    def _take_offer(self) -> Any:
        report, self._offer = self._offer, None
        return report

    # ------------------------------------------------------------------ members' side
    def form(self, gen: int, expect, t_start: float,
             planned: bool = False) -> tuple[list[int], bool]:
        """Join the rendezvous of generation ``gen`` (a re-form of ``gen - 1``): lead it when
        first, else wait for the leader's list. ``planned``: at a step boundary (the members
        come as they finish the step), not after a failure (they come together). Returns
        (members, whether this one led)."""
        st = self.store
        try:
            # a member the coordinator declared dead is fenced (its node was lost while the
            # process ran on): it must not join the generation formed without it, least of all
            # lead it and be killed before it publishes (a CI run's members all waited 35 s)
            if st.add(dead_key(self.uid), 0) > 0:  # one round trip (heartbeats create it)
                raise RendezvousError(f"gen {gen}: uid {self.uid} was declared dead")
            # my place, then who I am and what I expect in one key (two round trips)
            n = st.add(f"{self.ns}rdzv/{gen}/count", 1)
            report = self._take_offer()
            st.set(f"{self.ns}rdzv/{gen}/joined/{n}",
                   json.dumps([self.uid, [int(u) for u in expect], report]))
            if n == 1:
                return self._lead(gen, t_start + self.rendezvous_timeout,
                                  quick=not planned), True
            return self._follow(gen, t_start)
        except (dist.DistNetworkError, RendezvousError) as exc:
            # the store's host is gone (closed, not a timeout; member_list's wait wraps it): a
            # member with a standby to re-attach to goes there (runtime.reattach)
            if not isinstance(exc, dist.DistNetworkError) \
                    and not isinstance(exc.__cause__, dist.DistNetworkError):
                raise
            raise StoreLostError(f"gen {gen}: the coordinator's store is gone") from exc

    def _follow(self, gen: int, t_start: float) -> tuple[list[int], bool]:
        """A member that did not lead waits for the member list. The leader can die before it
        publishes (killed while it led: a second failure, a fenced process): once it is gone
        (a death notice, or silent for the staleness; its record missing that long) the first
        member to claim the next lead epoch (``lead/<e>``) leads instead, without it. Leaders
        publish through one ``compare_set``: the first list is the generation's, a late
        leader takes it. Returns (members, whether this one led)."""
        st = self.store
        key = f"{self.ns}rdzv/{gen}/members"
        wait_s = self.rendezvous_timeout + self.staleness + 5.0
        end = time.monotonic() + wait_s
        try:  # nearly always published within the staleness: one blocking wait, no polling
            st.wait([key], timedelta(seconds=min(self._staleness(), wait_s)))
            return self._published(gen), False
        except dist.DistNetworkError:
            raise
        except dist.DistStoreError:  # a timeout: watch the leader from here on
            pass
        epoch, leader, since, gone, look = 0, None, time.monotonic(), [], 0.0
        while not st.check([key]):  # every 10 ms; the leader every 50 ms (store round trips)
            now = time.monotonic()
            if now > end:
                raise RendezvousError(f"gen {gen}: no member list after {wait_s:.1f}s")
            if now - look >= 0.05:
                look = now
                if leader is None:
                    leader = self._leader(gen, epoch)
                stale = self._staleness()
                if leader_gone(leader, self._live(LEADER_SILENCE * stale),
                               leader is not None and _notice(st, dead_key(leader)),
                               now - since, stale):
                    gone.append(leader)
                    if st.add(f"{self.ns}rdzv/{gen}/lead/{epoch + 1}", 1) == 1:
                        st.set(f"{self.ns}rdzv/{gen}/leader/{epoch + 1}", str(self.uid))
                        return self._lead(gen, t_start + self.rendezvous_timeout,
                                          without=[u for u in gone if u is not None]), True
                    epoch, leader, since = epoch + 1, None, now
            self._stop.wait(0.01)
        return self._published(gen), False

    def _leader(self, gen: int, epoch: int) -> int | None:
        """Who leads lead epoch ``epoch`` (0: the first to count itself in); None: not known
        yet."""
        key = (f"{self.ns}rdzv/{gen}/joined/1" if epoch == 0
               else f"{self.ns}rdzv/{gen}/leader/{epoch}")
        if not self.store.check([key]):
            return None
        v = json.loads(self.store.get(key))
        return int(v[0] if epoch == 0 else v)

    def _lead(self, gen: int, deadline: float, without: list[int] = (),
              quick: bool = False) -> list[int]:
        """The leader: wait for the live members and the expected joiners (or the deadline),
        then publish the member list with every report. ``without``: leaders before this one
        that died before they published (their records are in, they are not members);
        ``quick``: the members are expected within a few ms (a re-form after a failure)."""
        st, old = self.store, gen - 1
        joined: list[int] = []
        expected: set[int] = set()
        reports: dict[int, Any] = {}
        unread: list[int] = []  # places counted whose record was not there at the last look
        read_to = 0
        t_lead = time.monotonic()
        seen_epoch, checked, noticed = None, set(), set()  # death notices (below)
        while True:
            count = st.add(f"{self.ns}rdzv/{gen}/count", 0)
            unread += range(read_to + 1, count + 1)
            read_to = count
            if unread:
                for u, exp, r in self._records(gen, unread):
                    joined.append(u)
                    expected.update(exp)
                    if r is not None:
                        reports[u] = r
            peer_died = st.check([gloo_error_key(old, self.ns)])
            live = self._live(rendezvous_staleness(
                self._staleness(), self.heartbeat_period, peer_died))
            # a member still missing that a death notice names is not waited for: the
            # heartbeat thread learns of the notice only at its next read, up to a period on.
            # Its value is the notice: the heartbeat's own reads create the key at 0 (check
            # alone would say it exists), and this read must not create one. Each member's
            # key is read once per value of the notices' epoch (one counter, bumped with
            # every notice), not at every look: at 32 members those reads were most of a look
            epoch = st.add(DEAD_EPOCH, 0)
            if epoch != seen_epoch:
                seen_epoch, checked = epoch, set()
            for u in live:
                if u not in joined and u not in checked:
                    checked.add(u)
                    if _notice(st, dead_key(u)):
                        noticed.add(u)
            live = [u for u in live if u in joined or u not in noticed]
            came = [u for u in sorted(expected) if st.check([f"{self.ns}rdzv/{gen}/joiner/{u}"])]
            gone = [u for u in sorted(expected)
                    if u not in came and st.check([dead_key(u)])]
            if rendezvous_ready(joined, live, expected, came + gone) \
                    or time.monotonic() > deadline:
                break
            self._stop.wait(leader_look_s(quick, time.monotonic() - t_lead))
        # whoever joined is alive, even if a starved heartbeat made it look stale
        new = next_members([u for u in joined if u not in without] + came)
        for u in came:  # a joiner's offer is its registration's value (join())
            r = json.loads(st.get(f"{self.ns}rdzv/{gen}/joiner/{u}"))
            if r is not None:
                reports[u] = r
        reports = {u: r for u, r in reports.items() if u in new}
        mine = json.dumps({"members": new, "reports": {str(u): r for u, r in reports.items()}})
        # set once: a leader taken over (slow, not dead) may publish too, and loses
        if st.compare_set(f"{self.ns}rdzv/{gen}/members", "", mine).decode() != mine:
            return self._published(gen)
        self._keep_reports(gen, new, reports)
        return new

    def _records(self, gen: int, places: list[int]) -> list[tuple[int, list[int], Any]]:
        """The join records at ``places`` that are in the store now, as (uid, expected
        joiners, report); the places read are taken off ``places``, the others stay for the
        next look. A member writes its record just after it counts itself, but one killed in
        between never does: a blocking read of its place held the leader for the store's
        timeout (60 s) and then failed the rendezvous. One round trip (``check``) when every
        record is there, as it nearly always is, plus one (``multi_get``) to read them: at 32
        members on 2 cores every trip waits for the store's turn."""
        keys = [f"{self.ns}rdzv/{gen}/joined/{i}" for i in places]
        there = keys if self.store.check(keys) else [k for k in keys if self.store.check([k])]
        if not there:
            return []
        got = set(there)
        places[:] = [i for i, k in zip(places, keys) if k not in got]
        out = []
        for v in self.store.multi_get(there):
            u, exp, r = json.loads(v)
            out.append((int(u), [int(x) for x in exp], r))
        return out

    # ------------------------------------------------------------------ joiner's side
    def join(self, gen: int, timeout: float | None = None) -> list[int]:
        """Register as a joiner of ``gen`` (with this member's offer) and wait for the list."""
        self.store.set(f"{self.ns}rdzv/{gen}/joiner/{self.uid}", json.dumps(self._take_offer()))
        return self.member_list(gen, timeout)

    def member_list(self, gen: int, timeout: float | None = None) -> list[int]:
        """Wait for the leader's member list of ``gen``; it must include this worker."""
        key = f"{self.ns}rdzv/{gen}/members"
        wait_s = timeout or (self.rendezvous_timeout + self.staleness + 5.0)
        try:
            self.store.wait([key], timedelta(seconds=wait_s))
        except Exception as exc:  # DistStoreError subclasses RuntimeError; be broad
            raise RendezvousError(f"gen {gen}: no member list after {wait_s:.1f}s") from exc
        return self._published(gen)

    def _published(self, gen: int) -> list[int]:
        """The member list of ``gen`` in the store; RendezvousError when it leaves this one
        out."""
        rec = json.loads(self.store.get(f"{self.ns}rdzv/{gen}/members"))
        new = [int(u) for u in rec["members"]]
        if self.uid not in new:
            raise RendezvousError(f"gen {gen}: uid {self.uid} was left out of {new}")
        self._keep_reports(gen, new, {int(u): r for u, r in rec["reports"].items()})
        return new

    def _keep_reports(self, gen: int, members: list[int], reports: dict[int, Any]) -> None:
        got = generation_reports(members, reports)
        self.reports = None if got is None else (gen, got)

    # ------------------------------------------------------------------ process group
    def build(self, gen: int, new: list[int], old_members: list[int]) -> None:
        """Build generation ``gen``'s process group (the old one goes to the graveyard); after
        a re-form, wait until every member has built its own (RuntimeError: the group is
        broken before its first op)."""
        if self.pg is not None:
            if self.backend == "nccl":  # NCCL's abort does end an op stuck on a dead peer
                try:  # (gloo's does not: its op stays in the graveyard, never waited on)
                    self.pg.abort()
                except Exception:
                    pass
            self._graveyard.append((None, self.pg, None))
        self.init_pg(gen, new)
        if gen > 0:
            self._await_members(gen, new, old_members)

    def init_pg(self, gen: int, members: list[int]) -> None:
        """``self.pg``: generation ``gen``'s process group, a backend built directly (gloo's
        or NCCL's), not torch's default group: that one belongs to the model (a group of
        several ranks shards its model over it, FSDP2 or tensor parallelism), and a re-form
        must not replace it."""
        # a re-form's connect phase waits for every member's address with the init timeout: a
        # member that hung or died after the rendezvous costs that long, not the ops' safety
        # net (generation 0 waits for every process to start up: the full timeout)
        short = gen > 0 and self.init_timeout < self.pg_timeout
        # connect only the pairs an op uses (a ring all-reduce: two neighbours; the state copy
        # to a joiner: one pair) instead of gloo's full mesh: eagerly, every re-form at N
        # members made N(N-1) connections through the one store, the part of recovery that
        # grew fastest with N (bench/recovery_scaling.py). Read when the group is created;
        # TORCH_GLOO_LAZY_INIT=0 in the environment restores the full mesh.
        os.environ.setdefault(LAZY_INIT_ENV, "1")
        self.pg = new_backend(self.backend, dist.PrefixStore(f"{self.ns}pg/{gen}", self.store),
                              members.index(self.uid), len(members),
                              timedelta(seconds=self.init_timeout if short else self.pg_timeout))
        if short:
            self.pg._set_default_timeout(timedelta(seconds=self.pg_timeout))

    def _await_members(self, gen: int, new: list[int], old_members: list[int]) -> None:
        """Return once every member of ``gen`` has built its process group; raise
        RuntimeError when one of ``old_members`` died or went silent after the member list
        named it.

        Gloo connects a pair on its first op, and waits for the peer's address in the store
        for the init timeout, on the store client this loop shares: a member killed between
        the member list and its process group (a straggler the guard evicts while its peers
        re-form) froze every store call here -- the abort, the next re-form -- for 5 s (the
        soak, 2026-12-04). Once every member has posted its address, no op waits on the store.
        A client of the group's own would need a connection per re-form, and 32 members
        connecting at once waited 5 s for the store to answer (torch 2.13's TCPStore)."""
        st, me = self.store, self.uid
        st.set(f"{self.ns}rdzv/{gen}/built/{me}", "1")
        keys = [f"{self.ns}rdzv/{gen}/built/{u}" for u in new if u != me]
        deadline = time.monotonic() + self.init_timeout
        while keys and not st.check(keys):
            # the heartbeat thread's judgement of the old members (death notices included);
            # a joiner that never comes costs the deadline
            lost = set(new) & set(old_members) - set(self._live()) - {me}
            if lost:
                raise RuntimeError(f"dead or silent before its first op: {sorted(lost)}")
            if time.monotonic() > deadline:
                missing = [u for u in new if u != me and
                           not st.check([f"{self.ns}rdzv/{gen}/built/{u}"])]
                raise RuntimeError(f"no process group within {self.init_timeout:.1f}s: "
                                   f"{missing}")
            self._stop.wait(0.002)


def new_backend(backend: str, store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A process group's backend over ``store``, built without registering it as torch's
    default (or any) group: its ops are called on it directly (``allreduce([t], opts)``,
    ``send``, ``recv``)."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    if backend == "nccl":
        # an op abandoned on a dead peer is aborted by the next re-form, not by NCCL's
        # watchdog tearing this process down when its timeout passes
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    raise ValueError(f"backend {backend!r}: expected gloo or nccl")


def _notice(st: Any, key: str) -> bool:
    """Whether counter ``key`` holds a posted notice (> 0), without creating it."""
    return bool(st.check([key])) and int(st.get(key)) > 0
