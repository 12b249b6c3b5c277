"""supervise.rankgroup: the R processes of a group seen as one. Real processes; waits are on
process exits (pidfds), never on sleeps."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from unbroken.procwait import ExitWaiter
from unbroken.supervise.rankgroup import RankGroup

pytestmark = [pytest.mark.mp, pytest.mark.timeout(60)]


def _proc(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def _forever() -> subprocess.Popen:
    return _proc("import threading; threading.Event().wait()")


def test_a_rank_that_fails_fences_the_others_and_its_status_is_the_groups():
    ranks = [_forever(), _proc("raise SystemExit(3)"), _forever()]
    g = RankGroup(ranks)
    w = ExitWaiter()
    t0 = time.monotonic()
    while g.poll() is None:  # the exit waiter wakes on any rank's exit
        w.wait([g], 10)
        assert time.monotonic() - t0 < 20
    w.close()
    assert g.returncode == 3 and g.failed_rank == 1
    # nobody left running to block a collective: the others were SIGKILLed
    assert [p.returncode for p in ranks] == [-9, 3, -9]
    assert g.poll() == 3  # the status stays the first failure's


def test_a_lost_group_is_announced_before_its_other_ranks_are_fenced():
    # the launcher's death notice (on_lost) goes out while the siblings still run, so the
    # survivors re-form during the fence; an error exit is not a loss: no notice
    other = _forever()
    seen = []
    g = RankGroup([other, _proc("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")],
                  on_lost=lambda: seen.append(other.poll()))
    assert g.wait(timeout=20) == -9
    assert seen == [None] and other.returncode == -9
    assert g.poll() == -9 and seen == [None]  # once
    errored = RankGroup([_forever(), _proc("raise SystemExit(3)")],
                        on_lost=lambda: seen.append("error"))
    assert errored.wait(timeout=20) == 3 and seen == [None]


def test_done_means_every_rank_done():
    slow = _forever()
    g = RankGroup([_proc("pass"), slow])
    with pytest.raises(subprocess.TimeoutExpired):
        g.wait(timeout=0.3)
    assert g.poll() is None  # one rank finished, one runs: the group runs
    slow.kill()
    assert g.wait(timeout=10) == -9


def test_a_hung_rank_is_killed_with_its_group():
    import signal

    ranks = [_forever(), _forever()]
    g = RankGroup(ranks)
    g.send_signal(signal.SIGSTOP)
    g.kill()
    assert g.wait(timeout=10) == -9
    assert all(p.returncode == -9 for p in ranks)


def test_all_ranks_exit_zero():
    g = RankGroup([_proc("pass"), _proc("pass")])
    assert g.wait(timeout=20) == 0
    assert g.pid == g.pids[0] and len(g.pids) == 2
