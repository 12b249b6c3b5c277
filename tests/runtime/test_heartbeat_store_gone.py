"""A member's heartbeat once its coordinator's store is gone.

Why it matters: torch's store client formats its socket's address with a reverse DNS query
on every failed call. A heartbeat that went on beating a dead store sent ten such queries a
second per member for as long as the job waited for a standby, and the resolver dropped the
takeover's own lookups among them (R = 2 under node agents: 4.5-8.6 s from the kill to the
next commit; 2.0-2.3 s once the beats stopped and the agents' resolver gave up after 1 s).
The verdict "store gone" is final until a re-attach
brings a new heartbeat, so the old one stops calling the store.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from datetime import timedelta

import pytest

pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from unbroken.runtime.ftcomm_heartbeat import Heartbeat  # noqa: E402

pytestmark = pytest.mark.mp

PERIOD = 0.05


class _Owner:
    """The communicator's side of the heartbeat, for one member alone in generation 0."""

    def __init__(self) -> None:
        self.gone = threading.Event()

    def _current(self):
        return 0, [0]

    def _staleness(self) -> float:
        return 10.0

    def _check_abort(self, gen: int) -> bool:
        return False

    def _set_abort(self, gen, reason, store=None) -> None:
        raise AssertionError(f"nobody to abort for: {reason}")

    def _peer_aborted(self, gen, how="") -> None:
        raise AssertionError("no peer")

    def _store_gone(self) -> None:
        self.gone.set()

    def _supervisor_silent(self, silent: float) -> None:
        pass

    def _sibling_lost(self, rank: int, silent: float) -> None:
        raise AssertionError("no sibling")


class _Counted:
    """A real store client whose calls are counted (the heartbeat's own client)."""

    def __init__(self, store) -> None:
        self._store, self.calls = store, 0

    def __getattr__(self, name):
        fn = getattr(self._store, name)
        if not callable(fn):
            return fn

        def counted(*a, **kw):
            self.calls += 1
            return fn(*a, **kw)
        return counted


def _client(port: int):
    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=10))


@pytest.mark.timeout(60)
def test_a_heartbeat_whose_store_died_stops_calling_it():
    host = subprocess.Popen([sys.executable, "-m", "unbroken.runtime.store_host"],
                            stdout=subprocess.PIPE, text=True)
    stop, hb = threading.Event(), None
    try:
        port = int(host.stdout.readline())
        owner, beats = _Owner(), _Counted(_client(port))
        hb = Heartbeat(owner, 0, _client(port), period=PERIOD, staleness=10.0,
                       supervisor_staleness=0.0, stop=stop, client=beats)
        # beating: the count grows while the store lives
        before = beats.calls
        assert not owner.gone.wait(20 * PERIOD)
        assert beats.calls >= before + 5, (before, beats.calls)

        host.send_signal(signal.SIGKILL)
        host.wait(timeout=10)
        assert owner.gone.wait(30), "the heartbeat never judged its dead store gone"
        at_verdict = beats.calls
        # 40 periods after the verdict: before this change, ~40 more failed calls (each a
        # reverse DNS query); now at most the one that may have been under way
        assert not stop.wait(40 * PERIOD)
        assert beats.calls <= at_verdict + 1, (at_verdict, beats.calls)
        assert hb._thread.is_alive()  # idle until its owner closes it
    finally:
        stop.set()
        if hb is not None:
            hb.close()
        host.kill()
        host.wait(timeout=10)
    assert not hb._thread.is_alive()  # a close ends it at once
