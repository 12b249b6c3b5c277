"""Holding and waiting for the supervisor's etcd lease.

Why a thread of its own: the lease must be renewed whatever the supervisor's loop is doing
(a checkpoint, a slow guard), and a supervisor that cannot renew it must learn so before its
TTL runs out, since a standby may act from then on. :class:`LeaseKeeper` renews every third
of the TTL with its own client and sets :attr:`LeaseKeeper.lost` when etcd says the lease is
gone or no renewal succeeded for a whole TTL (partitioned, no quorum): from then on the
holder must not act (every write is guarded anyway: ``coord.jobstate``).

:func:`wait_for_lease` is the standby's side: read the job, decide with
``core.coordination.takeover``, and while the move is "wait" watch the leader key (etcd wakes
the standby the moment the lease expires and takes the key with it; ``poll`` bounds one watch,
so a stop of the standby or a change elsewhere is seen within it). On "take" it acquires; two
standbys racing for it are resolved by etcd's create-if-absent transaction.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from unbroken.coord.etcd import Etcd, EtcdError
from unbroken.coord.jobstate import EtcdJobState

__all__ = ["LeaseKeeper", "wait_for_lease"]


class LeaseKeeper:
    """Renews ``lease`` (``ttl`` s) until :meth:`stop`; :attr:`lost` is set if it could not."""

    def __init__(self, endpoints: list[str], lease: int, ttl: float) -> None:
        self.etcd = Etcd(endpoints, timeout=max(0.2, ttl / 6))
        self.lease, self.ttl = lease, ttl
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etcd-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self.ttl / 3):
            try:
                if self.etcd.keepalive(self.lease) <= 0:
                    self.lost.set()  # expired: somebody else may hold the job now
                    return
                last_ok = time.monotonic()
            except EtcdError:
                if time.monotonic() - last_ok >= self.ttl:
                    self.lost.set()
                    return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.ttl)


def wait_for_lease(state: EtcdJobState, ttl: int, *, poll: float = 1.0,
                   stopped: Callable[[], bool] = lambda: False,
                   on_move: Callable[[str, str], None] | None = None,
                   tick: Callable[[], None] = lambda: None) -> tuple[str, str]:
    """Block until this standby holds the lease (``("take", reason)``), the job finished
    (``("stop", reason)``) or ``stopped()``; ``on_move(move, reason)`` hears each new move,
    ``tick()`` is called each round."""
    said = None
    while not stopped():
        try:
            tick()  # at least every ``poll`` s (the standby's own announcement is renewed)
            move, why = state.standby_move()
        except EtcdError as e:  # no quorum: nobody can take over, keep looking
            move, why = "wait", f"etcd: {e}"
        if (move, why) != said and on_move is not None:
            on_move(move, why)
        said = (move, why)
        if move == "stop":
            return move, why
        if move == "take":
            try:
                ok, why = state.acquire(ttl)
            except EtcdError as e:
                ok, why = False, f"etcd: {e}"
            if ok:
                return "take", why
        if move == "wait" and state.read_revision:  # woken when the leader key goes
            state.etcd.watch(state.key("leader"), state.read_revision + 1, poll)
        else:
            time.sleep(0.1)  # etcd down or a lost race: a retry interval, not a synchronisation
    return "stop", "stopped while standing by"
