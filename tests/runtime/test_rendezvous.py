"""The rendezvous leader on a real TCPStore: a member killed between counting itself in and
writing its record (the two store calls of ``Rendezvous.form``) must not hold the leader."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

dist = pytest.importorskip("torch.distributed")

from unbroken.runtime.ftcomm_rendezvous import Rendezvous  # noqa: E402

pytestmark = pytest.mark.server

STORE_TIMEOUT = 20.0  # a blocking read of the missing record would hold the leader this long


def _rdzv(uid: int, store, live: list[int]) -> Rendezvous:
    return Rendezvous(uid, store, backend="gloo", heartbeat_period=0.1, staleness=1.0,
                      rendezvous_timeout=STORE_TIMEOUT * 2, init_timeout=5.0, pg_timeout=5.0,
                      live=lambda *_: list(live), judging_staleness=lambda: 1.0,
                      graveyard=[], stop=threading.Event())


@pytest.mark.timeout(60)
def test_a_member_killed_between_counting_itself_and_its_record_does_not_hold_the_leader():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=STORE_TIMEOUT))

    def client():
        return dist.TCPStore("127.0.0.1", server.port, is_master=False,
                             timeout=timedelta(seconds=STORE_TIMEOUT))

    live = [0, 1]  # uid 2 is dead: the heartbeat no longer counts it live
    got: dict[int, object] = {}

    def member(uid: int) -> None:
        try:
            got[uid] = _rdzv(uid, client(), live).form(1, [], time.monotonic())
        except Exception as exc:  # the assertion below names it
            got[uid] = exc

    t0 = time.monotonic()
    leader = threading.Thread(target=member, args=(0,), daemon=True)
    leader.start()
    server.wait(["rdzv/1/joined/1"])  # uid 0 counted itself first: it leads
    assert server.add("rdzv/1/count", 1) == 2  # uid 2's place, and then it was killed
    other = threading.Thread(target=member, args=(1,), daemon=True)
    other.start()
    leader.join(STORE_TIMEOUT * 2)
    other.join(STORE_TIMEOUT * 2)
    took = time.monotonic() - t0
    assert got[0] == ([0, 1], True), got
    assert got[1] == ([0, 1], False), got
    assert took < STORE_TIMEOUT / 4, f"the leader waited {took:.1f}s for a record never written"
