"""The agent's cut-off watchdog (``nodes.agent._Beat``): a heartbeat call that blocks (a cut
link: no RST, the call sits in the kernel) for ``cut_after`` seconds of the watchdog's own
ticks ends the node; beats that return, however many, never do. The store here only has to
block or answer: the component under test is the watchdog (the real cut is
``test_netns_agents.py``)."""

from __future__ import annotations

import threading

import pytest

from unbroken.nodes.agent import _Beat


class _Store:
    def __init__(self) -> None:
        self.calls = 0
        self.block = threading.Event()
        self.release = threading.Event()
        self.beat = threading.Event()

    def clone(self) -> "_Store":
        return self

    def add(self, key: str, value: int) -> int:
        self.calls += 1
        self.beat.set()
        if self.block.is_set():
            self.release.wait(30)
        return self.calls


@pytest.mark.timeout(30)
def test_a_blocked_beat_ends_the_node_and_answered_beats_never_do():
    st, cut, got = _Store(), threading.Event(), []
    beat = _Beat(st, 0, 0.01, on_cut=lambda s: (got.append(s), cut.set()), cut_after=0.3)
    try:
        while st.calls < 40:  # beats that answer: ~0.4 s of them, longer than cut_after
            st.beat.clear()
            assert st.beat.wait(5)
        assert not cut.is_set()
        st.block.set()  # the next beat never returns
        assert cut.wait(10)
        assert got[0].startswith("a heartbeat to the coordinator blocked for ")
        assert float(got[0].rsplit(" ", 1)[1].rstrip("s")) >= 0.3
    finally:
        beat.stop()
        st.release.set()
