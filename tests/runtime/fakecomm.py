"""An in-process stand-in for :class:`unbroken.runtime.ftcomm.FTComm`, for driving
:class:`~unbroken.runtime.stacked.StackedRunner` in threads (one thread per data-parallel
group), the way torchft's ``manager_test.py`` drives its Manager against a fake ProcessGroup.

What is fake and what is real
-----------------------------
* The collective: :class:`FakeGroup` holds one :class:`threading.Condition`. Every member of a
  generation issues its all-reduces in the same order (the runner's protocol guarantees it), so
  the n-th ``allreduce`` of generation g on every member is one *round* ``(g, n)``; the round
  completes when every member of g has contributed, and its sum (in uid order, float64) is
  copied into each caller's tensor.
* A failure: :meth:`FakeGroup.kill` marks a member dead and aborts the current generation.
  A round that had not completed then returns False on every survivor that waits in it or
  issues it later, and the caller's tensor keeps its input (FTComm's contract). A round that
  completed before the abort still returns True (the op finished: "died after sending").
* ``reform()`` is a rendezvous among the old members that are not dead: every survivor gets
  the same sorted member list, the generation increments and ``rank`` is the index in it.
  Like FTComm's, it aborts the old generation first, so a peer still issuing ops there fails.
* The store is real: a ``torch.distributed.TCPStore`` hosted by the test process; each member
  gets its own client connection, as each FTComm has (:class:`StorePool`: shared by the jobs
  of a module under per-job key prefixes).

Test hooks (in the fake, never in the runner)
---------------------------------------------
* ``die_at_call=K``: the member dies at its K-th all-reduce (0-based, counted over the whole
  run). In a failure-free run the runner issues exactly one all-reduce per step, so K is the
  step: the member has computed step K's gradients and dies before sending
  (``die_after_send=False``), or after its contribution completed the round, without
  returning to the runner (``die_after_send=True``). Death is :class:`MemberDied`, a
  ``BaseException``, so the runner's ``except Exception`` around user code cannot swallow it.
* ``drop_at_call=K``: the K-th all-reduce completes but this member is told it failed (a local
  error after the peers finished): the runner must roll it forward after the re-form.

* Admission of spares: ``FakeGroup(uids, spares=[...])`` gives spare uids a store client;
  ``reform(expect=joiners, planned=True)`` forms the next generation from the live old members
  and every joiner any member expects (the union, as FTComm's leader waits for) once all of
  them arrived, a joiner arriving through ``join(gen)``; ``planned`` leaves the old generation
  unaborted. The fake has no ``send``, so the runner copies the state to a joiner through an
  all-reduce only the source contributes to (its fallback for such a communicator).

Not modelled: heartbeats and staleness (a death is known at once, as after a launcher's
``declare_dead``), ``on_issue``, point-to-point ``send``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist


class MemberDied(BaseException):
    """Raised in a member's own thread when the fake kills it (its "process" ends)."""


class FakeCommTimeout(RuntimeError):
    """A wait in the fake took longer than the group's ``wait_s`` (a test would hang)."""


class _Round:
    __slots__ = ("parts", "result")

    def __init__(self) -> None:
        self.parts: dict[int, torch.Tensor] = {}
        self.result: torch.Tensor | None = None


class StorePool:
    """A real TCPStore server hosted in this process and one client connection per member
    thread, shared by the jobs of a test module, each job under its own key prefix.

    Why shared: every new TCPStore connection makes a reverse DNS query for 127.0.0.1
    (``1.0.0.127.in-addr.arpa`` PTR, from the client and again from the server thread after
    ``accept``; seen with strace). Where the nameserver drops one, glibc retries after 5 s,
    and a test's Store call stalls for 5 s (here: about one connection in 40).
    Connecting once per module instead of once per job keeps the tests fast. A client is
    used by one thread at a time (a job's member thread).
    """

    def __init__(self, timeout_s: float = 20.0) -> None:
        self.server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=timeout_s))
        self._clients: list[dist.Store] = []
        self._jobs = 0

    def job(self, n: int) -> tuple[dist.Store, list[dist.Store]]:
        """(a store for the test thread, one per member) under a fresh prefix."""
        self._jobs += 1
        while len(self._clients) < n:
            self._clients.append(self.server.clone())
        pre = f"job{self._jobs}"
        return (dist.PrefixStore(pre, self.server),
                [dist.PrefixStore(pre, c) for c in self._clients[:n]])


class FakeGroup:
    """The shared state of N fake communicators (one per member thread)."""

    def __init__(self, uids: list[int], *, spares: list[int] | tuple[int, ...] = (),
                 stores: StorePool | None = None, wait_s: float = 20.0,
                 offers: bool = True) -> None:
        self.cond = threading.Condition()
        # FTComm's offer/reports: the settle reads what each member offered with the
        # rendezvous (False: the fallback, one all-reduce of the reports)
        self.offers: dict[int, dict[int, Any]] | None = {} if offers else None
        self.wait_s = wait_s
        self.gen_members: dict[int, list[int]] = {0: sorted(uids)}
        self.aborted: set[int] = set()
        self.dead: set[int] = set()
        self.rounds: dict[tuple[int, int], _Round] = {}
        self.rdzv: dict[int, set[int]] = {}
        self.expect: dict[int, set[int]] = {}  # gen -> joiners any member expects in it
        self.cut: dict[tuple[int, int], int] = {}  # (gen, seq) -> the uid cut off in it
        everyone = sorted(uids) + sorted(spares)
        self.store, clients = (stores or StorePool(wait_s)).job(len(everyone))
        self._client = dict(zip(everyone, clients))

    def comm(self, uid: int, **hooks: Any) -> FakeComm:
        return FakeComm(self, uid, **hooks)

    # ------------------------------------------------------------ called with cond held
    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.wait_s
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                raise FakeCommTimeout(f"fake comm: {what} did not happen in {self.wait_s}s")
            self.cond.wait(left)

    def _abort(self, gen: int) -> None:
        if gen not in self.aborted:
            self.aborted.add(gen)
            self.cond.notify_all()

    def kill(self, uid: int) -> None:
        """Member ``uid`` is gone: every generation it belongs to is broken."""
        with self.cond:
            self.dead.add(uid)
            for g, ms in self.gen_members.items():
                if uid in ms:
                    self._abort(g)
            self.cond.notify_all()


class FakeComm:
    """The part of FTComm's API the runner uses, over a :class:`FakeGroup`."""

    def __init__(self, group: FakeGroup, uid: int, *, die_at_call: int | None = None,
                 die_after_send: bool = False, drop_at_call: int | None = None,
                 cut_at_call: int | None = None) -> None:
        self.group = group
        self.uid = uid
        self.store = group._client[uid]
        self.store_lost = False
        self.supervisor_lost = False
        self.on_issue: Any = None
        self.journal: list[dict] = []
        self.calls = 0          # all-reduces issued over the whole run
        self.tensors: list[torch.Tensor] = []  # what this member sent, in call order
        self.die_at_call, self.die_after_send = die_at_call, die_after_send
        self.drop_at_call = drop_at_call
        # a link cut: this call completes here and fails everywhere else, the next one dies
        self.cut_at_call = cut_at_call
        if cut_at_call is not None:
            self.die_at_call, self.die_after_send = cut_at_call + 1, False
        self._gen = 0
        self._seq = 0           # all-reduces issued in the current generation
        self._members = list(group.gen_members[0])
        self._offer: Any = None
        self.reports: tuple[int, dict[int, Any]] | None = None
        if group.offers is not None:
            self.offer = self._set_offer  # only then: the runner looks the method up

    def _set_offer(self, report: Any) -> None:
        self._offer = report

    def _publish_offer(self, gen: int) -> None:
        """With the group's lock held: this member's offer for generation ``gen``."""
        offers = self.group.offers
        if offers is not None and self._offer is not None:
            offers.setdefault(gen, {})[self.uid] = self._offer
        self._offer = None

    @property
    def generation(self) -> int:
        return self._gen

    @property
    def members(self) -> list[int]:
        return list(self._members)

    @property
    def rank(self) -> int:
        return self._members.index(self.uid)

    def allreduce(self, tensor: torch.Tensor) -> bool:
        g = self.group
        call, self.calls = self.calls, self.calls + 1
        self.tensors.append(tensor.detach().clone())
        if call == self.die_at_call and not self.die_after_send:
            self._die(f"before sending call {call}")
        gen, seq = self._gen, self._seq
        self._seq += 1
        with g.cond:
            if gen in g.aborted:
                self.journal.append({"event": "abort", "gen": gen, "call": call})
                return False
            rnd = g.rounds.setdefault((gen, seq), _Round())
            rnd.parts[self.uid] = tensor.detach().clone()
            if call == self.cut_at_call:
                g.cut[(gen, seq)] = self.uid
            members = g.gen_members[gen]
            if len(rnd.parts) == len(members):
                total = torch.zeros_like(tensor)
                for u in members:  # a fixed order: every member gets the same bits
                    total += rnd.parts[u]
                rnd.result = total
                g.cond.notify_all()
            g._wait(lambda: rnd.result is not None or gen in g.aborted,
                    f"round {(gen, seq)} on uid {self.uid}")
            done = rnd.result is not None
        if call == self.die_at_call:  # die_after_send: the op completed, nobody hears back
            self._die(f"after sending call {call}")
        if not done:
            self.journal.append({"event": "abort", "gen": gen, "call": call})
            return False
        if g.cut.get((gen, seq), self.uid) != self.uid:  # the cut member's link took it down
            self.fail(f"cut: call {call} lost with uid {g.cut[(gen, seq)]}")
            return False
        if call == self.drop_at_call:  # completed everywhere, but this member saw an error
            self.fail(f"injected: call {call} reported as failed")
            return False
        tensor.copy_(rnd.result)
        return True

    def fail(self, reason: str) -> None:
        with self.group.cond:
            self.group._abort(self._gen)
        self.journal.append({"event": "abort", "gen": self._gen, "reason": reason})

    def reform(self, expect: list[int] | tuple[int, ...] = (), *,
               planned: bool = False) -> list[int]:
        g = self.group
        old, gen = self._gen, self._gen + 1
        with g.cond:
            if not planned:
                g._abort(old)
            self._publish_offer(gen)
            g.rdzv.setdefault(gen, set()).add(self.uid)
            g.expect.setdefault(gen, set()).update(expect)
            g.cond.notify_all()

            def complete() -> bool:
                if gen in g.gen_members:
                    return True
                want = {u for u in set(self._members) | g.expect[gen] if u not in g.dead}
                if want <= g.rdzv[gen]:
                    g.gen_members[gen] = sorted(want)
                    g.cond.notify_all()
                    return True
                return False

            g._wait(complete, f"rendezvous of gen {gen} on uid {self.uid}")
        return self._enter(gen)

    def join(self, gen: int) -> list[int]:
        """A spare enters generation ``gen`` (the one the members re-form with it)."""
        g = self.group
        with g.cond:
            self._publish_offer(gen)
            g.rdzv.setdefault(gen, set()).add(self.uid)
            g.cond.notify_all()
            g._wait(lambda: gen in g.gen_members, f"admission to gen {gen} of uid {self.uid}")
        return self._enter(gen)

    def _enter(self, gen: int) -> list[int]:
        with self.group.cond:
            new = list(self.group.gen_members[gen])
            got = (self.group.offers or {}).get(gen, {})
            self.reports = (gen, {u: got[u] for u in new}) if all(u in got for u in new) \
                else None
        if self.uid not in new:
            raise RuntimeError(f"uid {self.uid} left out of gen {gen}")
        self._gen, self._seq, self._members = gen, 0, new
        self.journal.append({"event": "reform", "gen": gen, "members": new})
        return list(new)

    def close(self) -> None:
        pass

    def _die(self, where: str) -> None:
        self.journal.append({"event": "died", "where": where, "call": self.calls - 1})
        self.group.kill(self.uid)
        raise MemberDied(f"uid {self.uid} died {where}")
