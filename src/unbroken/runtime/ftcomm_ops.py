"""The op path of :class:`~unbroken.runtime.ftcomm.FTComm`: issue a collective, sleep until it
completes or its generation is aborted, and abandon a broken one to the graveyard.

* Every collective is issued with ``async_op=True``; the caller sleeps until the op's future
  completes or the generation is aborted, so no thread ever blocks in gloo.
* A peer's abort (its flag in the store, a dead or stale member, its doorbell) reaches the op
  through the heartbeat thread, which sets the local flag and wakes it: the op itself makes no
  store round trip, so the step's critical path has none.
* On abort the in-flight ``Work``, its process group and the buffer are moved to a
  *graveyard*: kept referenced forever, never waited on and never freed, because the gloo
  threads may still touch them. The buffer is the caller's tensor when the op ran in place
  (an all-reduce of a contiguous tensor, every ``send``): the caller must not reuse it.

:class:`OpPath` is a mixin of ``FTComm``, not a helper object it owns, because its state is
truly shared and hot: on every wake-up the op reads the generation, the abort flag and
``store_lost``, which the heartbeat thread, the doorbell thread and the rendezvous write on the
communicator; through a helper each read would cost one more indirection on the step's
critical path. It keeps no state of its own beyond ``_warm`` (set by the first completed op)
and the ``on_issue`` test hook; what it uses of ``FTComm`` is listed on the class.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from unbroken.runtime.ftcomm_heartbeat import gloo_error_key

__all__ = ["OpPath", "short_error"]


class OpPath:
    """``allreduce`` and ``send``: the collectives of ``FTComm`` and how they fail.

    What it uses of the communicator is annotated below: the generation, the abort flag
    (``aborted``, ``_check_abort`` ... ``_note_detect``) and the event that wakes a waiting
    op (``_wake``), set by a completed future, an abort or a lost store.
    """

    uid: int
    store: Any
    store_lost: bool
    staleness: float
    poll_interval: float
    graveyard: list
    on_issue: Any
    _gen: int
    _warm: bool
    _wake: threading.Event
    _abort_reason: str | None
    rank: int
    aborted: bool
    _check_abort: Callable[[int], bool]
    _set_abort: Callable[..., None]
    _note_detect: Callable[[str], None]

    def allreduce(self, tensor: torch.Tensor) -> bool:
        """Sum ``tensor`` in place across the current members.

        Returns True when the op completed on this rank (the tensor then holds the sum).
        Returns False when the generation broke (gloo error, abort flag, stale or dead member):
        the op is abandoned to the graveyard *with* ``tensor`` (a gloo thread may still write
        into it, so the caller must not reuse it), and the caller should ``reform()`` and retry
        with a fresh buffer. Reducing in place saves two copies of the buffer a step.
        """
        gen = self._gen
        if self._refused(gen):
            return False
        buf = tensor.detach()
        inplace = buf.is_contiguous()
        if not inplace:
            buf = buf.contiguous()
        pg = self._rdzv.pg
        ok = self._run(gen, lambda: [pg.allreduce([buf], _SUM)], buf)
        if ok and not inplace:
            tensor.copy_(buf)
        return ok

    def send(self, tensor: torch.Tensor, src: int, to: list[int]) -> bool:
        """Copy ``tensor`` from rank ``src`` to the ranks ``to``, point to point: only they
        take part (every other member returns True at once and leaves ``tensor`` alone), so
        the cost of a state copy to a joiner does not grow with the number of members.

        The failure semantics of :meth:`allreduce`: False when the generation broke, with
        ``tensor`` abandoned to the graveyard; a peer's death or abort wakes the wait.
        """
        gen = self._gen
        if self._refused(gen):
            return False
        r = self.rank
        if r != src and r not in to:
            return True
        if not tensor.is_contiguous():
            raise ValueError("send needs a contiguous tensor (it is received in place)")
        buf = tensor.detach()
        pg = self._rdzv.pg
        if r == src:
            return self._run(gen, lambda: [pg.send([buf], d, 0) for d in to if d != src], buf,
                             p2p=True)
        return self._run(gen, lambda: [pg.recv([buf], src, 0)], buf, p2p=True)

    def _refused(self, gen: int) -> bool:
        """An op on a generation already aborted fails at once. The local flag only: a peer's
        abort reaches us through the heartbeat thread; a store round trip here would sit on
        every step's path."""
        if self._check_abort(gen):
            self._note_detect(self._abort_reason or "abort flag")
            return True
        return False

    def _run(self, gen: int, issue: Callable[[], list], buf: torch.Tensor,
             p2p: bool = False) -> bool:
        """Issue an op's works and sleep until they complete or ``gen`` is aborted.

        ``p2p``: gloo's send/recv run in the issuing thread, and with pairs connected on first
        use the issue itself waits for the peer (a dead one: until the group's timeout), so a
        thread issues and waits them and an abort still wakes the caller."""
        if not self.aborted:  # _wake is set by an abort (checked below) or by this op's end
            self._wake.clear()
        futs: list = []
        works: list | None = None
        if p2p:
            waited = self._in_thread(issue)
        else:
            try:
                works = issue()
            except RuntimeError as exc:  # broken PG: fails at once
                self._abandon(gen, None, buf, f"gloo error at issue: {short_error(exc)}")
                return False
            for work in works:  # wake the moment the op completes, instead of polling it
                #   every millisecond: four workers on two cores spent measurable CPU in
                #   1 kHz wake-ups
                fut = work.get_future()
                fut.add_done_callback(lambda _f: self._wake.set())
                futs.append((work, fut))
            waited = _NOTHING_TO_WAIT
        if self.on_issue is not None:
            hook, self.on_issue = self.on_issue, None
            hook()
        lost_since: float | None = None
        while True:
            # the future completes a moment before the work is marked finished: between the
            # two, testing is_completed() alone spun (160 wake-ups a step on a busy box);
            # a done future means wait() returns at once, in C++, without the GIL
            if waited[0].is_set() and all(f.done() or w.is_completed() for w, f in futs):
                try:
                    if waited[1]:
                        raise waited[1][0]
                    for work, _f in futs:
                        work.wait()
                except RuntimeError as exc:
                    self._abandon(gen, works, buf, f"gloo error: {short_error(exc)}")
                    return False
                self._warm = True
                if not self.aborted:
                    self._wake.clear()  # this op's completion, not an abort
                return True
            # a peer's abort (the store's flag, a dead or stale member) arrives through the
            # heartbeat thread, which sets the local flag and wakes us
            if self._check_abort(gen):
                self._abandon(gen, works, buf, None)
                return False
            if self.store_lost:
                # nobody can judge the peers without the store: an op still waiting a
                # staleness after the loss waits for peers that went with the coordinator
                # (seen: a supervisor killed during start-up, two members stuck in their first
                # all-reduce until gloo's own timeout)
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > self.staleness:
                    self._abandon(gen, works, buf, "the coordinator's store is gone")
                    return False
            self._wake.wait(self.poll_interval)
            if not self.aborted:  # woken by this op's future (tested above) or the timeout
                self._wake.clear()

    def _in_thread(self, issue: Callable[[], list]) -> tuple[threading.Event, list]:
        """Issue works and ``wait()`` on them on a thread that wakes the op's caller when they
        are done: (done, [error]). An abandoned one ends with the group's timeout."""
        done, err = threading.Event(), []

        def wait_all() -> None:
            try:
                for work in issue():
                    work.wait()
            except RuntimeError as exc:
                err.append(exc)
            finally:
                done.set()
                self._wake.set()

        threading.Thread(target=wait_all, daemon=True, name=f"ftcomm-p2p-{self.uid}").start()
        return done, err

    def _abandon(self, gen: int, work: Any, buf: Any, error: str | None) -> None:
        if error is not None:
            try:  # evidence that a peer *process* is gone (its sockets closed)
                self.store.set(gloo_error_key(gen, self.ns), error)
            except Exception:
                self.store_lost = True
            self._set_abort(gen, error)
        self._note_detect(self._abort_reason or error or "abort flag")
        self.graveyard.append((work, self._rdzv.pg, buf))


#: the step's reduction (one options object: built once, not on every op)
_SUM = dist.AllreduceOptions()
_SUM.reduceOp = dist.ReduceOp.SUM

#: a collective's works complete through their futures: no thread to wait for
_NOTHING_TO_WAIT: tuple[threading.Event, list] = (threading.Event(), [])
_NOTHING_TO_WAIT[0].set()


def short_error(exc: BaseException, n: int = 160) -> str:
    """The first line of an error, for a journal or a message."""
    s = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return s[:n]
