"""A standby's collection of re-attach reports (``supervise.adopt.collect``) on a real store:
a group of several ranks counts once every rank reported; a group whose ranks did not all
come is adopted as lost and its paused ranks are stopped (they could never train again)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest

from unbroken.protocol import reattach_key
from unbroken.supervise.adopt import AdoptedProc, collect

pytestmark = [pytest.mark.mp, pytest.mark.timeout(60)]


def _report(store, uid: int, rank: int, pid: int) -> None:
    store.set(reattach_key(uid, rank), json.dumps({
        "uid": uid, "rank": rank, "pid": pid, "slot": uid, "step": 41, "gen": 3,
        "members": [0, 1], "slot_of": {"0": 0, "1": 1}, "stopped_t": 1.0}))


def test_a_group_counts_once_all_its_ranks_reported_and_a_partial_one_is_stopped():
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=10))
    paused = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
              for _ in range(3)]
    try:
        _report(store, 0, 0, paused[0].pid)
        _report(store, 0, 1, paused[1].pid)
        _report(store, 1, 0, paused[2].pid)  # group 1's rank 1 died with the supervisor
        got, why, reports = collect(store, {0, 1}, timeout=0.3, ranks=2)
        assert got is not None and got.members == (0, 1) and got.missing == (1,), why
        assert got.step == 41 and "never re-attached" in why
        assert reports[0]["pids"] == [paused[0].pid, paused[1].pid] and 1 not in reports
        assert paused[2].wait(timeout=10) == -9  # the lone rank of group 1: stopped
        assert paused[0].poll() is None and paused[1].poll() is None  # adopted: running
        handle = AdoptedProc(paused[1].pid, 0, store, rank=1)
        paused[1].kill()
        paused[1].wait(timeout=10)
        assert handle.wait(timeout=10) == -9  # no exit/0.1 posted: it was killed
    finally:
        for p in paused:
            p.kill()
            p.wait(timeout=10)


def test_a_member_reporting_after_the_adoption_is_fenced_by_the_go():
    """The go names the adopted uids: a member the standby adopted as lost (it came after
    the adopt timeout) reads it and leaves instead of training on beside its replacement."""
    import threading
    from types import SimpleNamespace

    import torch.distributed as dist

    from unbroken.protocol import ADOPTED
    from unbroken.runtime.reattach import ReattachFailed, report

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=10))
    runner = SimpleNamespace(comm=SimpleNamespace(generation=3, members=[0, 1]),
                             slot_of={0: 0, 1: 1}, step=41)
    got: dict[int, object] = {}

    def member(uid: int) -> None:
        try:
            report(store.clone(), uid, runner, 10.0, 1.0)
            got[uid] = "adopted"
        except ReattachFailed as e:
            got[uid] = str(e)
    threads = [threading.Thread(target=member, args=(u,)) for u in (0, 1)]
    for t in threads:
        t.start()
    store.set(ADOPTED, json.dumps([0]))  # uid 1 was adopted as lost
    for t in threads:
        t.join(timeout=20)
    assert got[0] == "adopted"
    assert "without this member" in str(got[1]) and "replaced" in str(got[1]), got
