"""Stacked data-parallel training on real processes: 4 gloo groups, r = 2, real SIGKILL.

The test process is the coordinator (it hosts the store, so any group may die). Faults are
injected at a deterministic point: ``--die-at K`` makes a group SIGKILL itself after computing
step K's gradients and before its all-reduce; the test waits for that (store key + process exit),
then posts the death notice a launcher would. Synchronisation is by store keys and process
exits only.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytest.importorskip("torch")

from helpers import events, finish, kill_and_notify  # noqa: E402

from unbroken.protocol import ExitCode  # noqa: E402
from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.trainer import reference_run  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

pytestmark = pytest.mark.mp

CFG = TrainConfig(groups=4, redundancy=2, steps=30, seed=3)
UIDS = list(range(CFG.groups))


@pytest.fixture(scope="module")
def reference():
    return reference_run(CFG)


@pytest.mark.timeout(120)
def test_no_faults_equals_single_process_reference(reference, tmp_path):
    with StackedCluster(CFG, str(tmp_path)) as c:
        journals = finish(c, CFG, UIDS, reference, tol=1e-9)
    # plain data parallelism: each group contributed exactly its own type, one generation
    for u in UIDS:
        commits = events(journals[u], "commit")
        assert [e["mine"] for e in commits] == [[u]] * CFG.steps
        assert {e["gen"] for e in commits} == {0}


@pytest.mark.timeout(120)
def test_sigkill_one_group_is_masked_exactly_once(reference, tmp_path):
    victim, at = 1, 10
    survivors = [0, 2, 3]
    with StackedCluster(CFG, str(tmp_path), die_at={victim: at}) as c:
        t_kill = kill_and_notify(c, [victim], survivors)[victim]
        journals = finish(c, CFG, survivors, reference)  # the dead group's journal included
    # the victim committed steps 0..9, nothing after
    assert [e["step"] for e in events(journals[victim], "commit")] == list(range(at))
    for u in survivors:
        replans = events(journals[u], "replan")
        assert len(replans) == 1 and replans[0]["step"] == at
        assert replans[0]["members"] == survivors
        # type 1's other host is group 0 (stacks are (w, w+1)): it patches type 1 at depth 2
        assert replans[0]["patch"] == {"0": [1]} and replans[0]["depth"] == 2
        commits = {e["step"]: e for e in journals[u] if e["event"] == "commit"}
        assert commits[at]["gen"] == 1 and commits[at]["members"] == survivors
        assert commits[CFG.steps - 1]["mine"] == ([0, 1] if u == 0 else [u])
    # kill -> next committed step (step `at` committed by every survivor)
    lat = max(next(e["t"] for e in journals[u] if e["event"] == "commit" and e["step"] == at)
              for u in survivors) - t_kill
    print(f"kill -> next committed step on all survivors: {lat * 1000:.0f} ms")
    assert lat < 5.0


@pytest.mark.timeout(120)
def test_sigstop_hang_detected_by_heartbeat_is_masked_exactly_once(reference, tmp_path):
    # group 1 SIGSTOPs itself at step 10 (heartbeat thread frozen too) and nobody posts a death
    # notice: the survivors must find it by heartbeat staleness alone
    victim, at = 1, 10
    survivors = [0, 2, 3]
    with StackedCluster(CFG, str(tmp_path), stop_at={victim: at}) as c:
        try:
            t_stop = c.wait_key(f"stopped/{victim}", 60, alive=survivors)
            journals = finish(c, CFG, survivors, reference)
            assert c.procs[victim].poll() is None  # still there, stopped: a hang, not a death
            assert not c.store.check([f"dead/{victim}"])
            # FTComm's own journal, in each survivor's done/<uid>
            ft = {u: json.loads(c.store.get(f"done/{u}"))["journal"] for u in survivors}
        finally:
            c.procs[victim].kill()  # SIGKILL works on a stopped process
            assert c.procs[victim].wait(timeout=10) == -9
    assert [e["step"] for e in events(journals[victim], "commit")] == list(range(at))
    for u in survivors:
        replans = events(journals[u], "replan")
        assert len(replans) == 1 and replans[0]["step"] == at
        assert replans[0]["members"] == survivors and replans[0]["patch"] == {"0": [1]}
        commits = {e["step"]: e for e in journals[u] if e["event"] == "commit"}
        assert commits[at]["gen"] == 1 and commits[CFG.steps - 1]["members"] == survivors
        # detection came from the heartbeat (or a peer's abort flag), never a death notice
        aborts = [e["reason"] for e in ft[u] if e["event"] == "abort"]
        assert aborts and not any("declared dead" in r for r in aborts), aborts
    assert any("stale heartbeat" in e["reason"] for u in survivors for e in ft[u]
               if e["event"] == "abort")
    lat = max(next(e["t"] for e in journals[u] if e["event"] == "commit" and e["step"] == at)
              for u in survivors) - t_stop
    print(f"stop -> next committed step on all survivors: {lat * 1000:.0f} ms")
    assert lat < 2.5


def _wait_until(cond, what: str, c, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        assert all(p.poll() is None for p in c.procs.values()), f"a process exited before {what}"
        time.sleep(0.01)


@pytest.mark.timeout(120)
def test_a_member_paused_past_the_staleness_finds_itself_left_out(reference, tmp_path):
    # a live member paused from outside (SIGSTOP: what a starved or frozen machine looks like
    # to its peers) past the staleness: the peers re-form without it; continued, it finds
    # itself left out, journals its own heartbeat's silence and leaves (exit 9)
    victim, survivors = 2, [0, 1, 3]
    with StackedCluster(CFG, str(tmp_path)) as c:
        _wait_until(lambda: len(events(c.journal(victim), "commit")) >= 3, "step 2", c)
        os.kill(c.procs[victim].pid, signal.SIGSTOP)
        try:
            _wait_until(lambda: events(c.journal(0), "replan"), "re-plan", c)
        finally:
            os.kill(c.procs[victim].pid, signal.SIGCONT)
        assert c.procs[victim].wait(timeout=60) == ExitCode.JOIN_FAILED
        journals = finish(c, CFG, survivors, reference)
    (left,) = events(journals[victim], "left_out")
    assert left["beat_gap_max_s"] > 0.3 and "gen 1" in left["error"], left
    (replan,) = events(journals[0], "replan")
    assert replan["members"] == survivors and "stale heartbeat: [2]" in str(
        [events(journals[u], "replan")[0]["cause"] for u in survivors])


@pytest.mark.timeout(120)
def test_second_death_right_after_replan_is_masked_too(reference, tmp_path):
    # group 1 dies at step 10; group 3 (types (3, 0): shares none with group 1's (1, 2)) dies
    # right after its replan, in the new generation, before the retry all-reduce
    first, second, at = 1, 3, 10
    survivors = [0, 2]
    with StackedCluster(CFG, str(tmp_path), die_at={first: at},
                        die_after_replan=[second]) as c:
        t_kill = kill_and_notify(c, [first], [0, 2, 3])[first]
        kill_and_notify(c, [second], survivors)
        journals = finish(c, CFG, survivors, reference)
    assert [e["step"] for e in events(journals[first], "commit")] == list(range(at))
    assert [e["step"] for e in events(journals[second], "commit")] == list(range(at))
    (r3,) = events(journals[second], "replan")
    assert r3["step"] == at and r3["members"] == [0, 2, 3]
    for u in survivors:
        replans = events(journals[u], "replan")
        assert [e["step"] for e in replans] == [at, at]
        assert [e["members"] for e in replans] == [[0, 2, 3], survivors]
        assert [e["patch"] for e in replans] == [{"0": [1]}, {"2": [3]}]
        commits = {e["step"]: e for e in journals[u] if e["event"] == "commit"}
        assert commits[at]["gen"] == 2 and commits[at]["members"] == survivors
        assert commits[CFG.steps - 1]["mine"] == ([0, 1] if u == 0 else [2, 3])
    lat = max(next(e["t"] for e in journals[u] if e["event"] == "commit" and e["step"] == at)
              for u in survivors) - t_kill
    print(f"first kill -> step {at} committed after two re-forms: {lat * 1000:.0f} ms")
    assert lat < 5.0
