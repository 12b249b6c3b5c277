"""Stacked training under the harder failures: deaths at every point of the recovery, a
member that missed a commit its peers made, wipe-outs, and spares joining.

Real processes, real SIGKILL; faults injected by the victim itself at a deterministic point
(``unbroken.testing.faults``). The test process hosts the store (the coordinator) and plays the launcher:
it posts death notices and assigns warm spares. Synchronisation by store keys and process exits
only; every test has a hard timeout.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import events, finish, kill_and_notify  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.trainer import reference_run  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

pytestmark = pytest.mark.mp

CFG = TrainConfig(groups=4, redundancy=2, steps=24, seed=5)
# a spare joins at a step boundary once rank 0's heartbeat has read its join record (up to a
# period, 0.1 s): 20 MLP steps after the kill are ~0.1 s, and the members sometimes finished
# first (the spare then waits for an admission that never comes); 200 steps leave ~1 s
CFG_JOIN = TrainConfig(groups=4, redundancy=2, steps=200, seed=5)
CFG7 = TrainConfig(groups=7, redundancy=3, steps=16, seed=5)


@pytest.fixture(scope="module")
def ref4():
    return reference_run(CFG)


@pytest.fixture(scope="module")
def ref_join():
    return reference_run(CFG_JOIN)


@pytest.fixture(scope="module")
def ref7():
    return reference_run(CFG7)


def replans(journal: list[dict]) -> list[dict]:
    """Replans that dropped somebody (a starved heartbeat on this 2-core box can cause an
    extra re-form with everyone still in; it is harmless and not what these tests are about)."""
    return [e for e in events(journal, "replan") if e["patch"]]


@pytest.mark.timeout(150)
def test_kill_during_the_patch_compute_is_masked(ref7, tmp_path):
    # N = 7, r = 3: group 1 dies at step 6; group 0 (type 1's next host) is told to patch it
    # and dies during that patch compute; types 1 and 0 still have a third live host each
    survivors = [2, 3, 4, 5, 6]
    with StackedCluster(CFG7, str(tmp_path), die_at={1: 6}, die_in_patch=[0]) as c:
        kill_and_notify(c, [1], [0] + survivors)
        kill_and_notify(c, [0], survivors)
        j = finish(c, CFG7, survivors, ref7)
    assert replans(j[0]) == []  # died in the patch compute, before journaling the replan
    for u in survivors:
        rs = replans(j[u])
        assert [e["step"] for e in rs] == [6, 6] and rs[0]["patch"] == {"0": [1]}
        assert rs[-1]["members"] == survivors and rs[-1]["patch"] == {"5": [1], "6": [0]}


@pytest.mark.timeout(120)
def test_kill_during_the_retried_allreduce_is_masked(ref4, tmp_path):
    # group 1 dies at step 8; group 3 dies inside its retried all-reduce (just after issuing
    # it): groups 0 (types 0, 1) and 2 (types 2, 3) still cover every type
    survivors = [0, 2]
    with StackedCluster(CFG, str(tmp_path), die_at={1: 8}, die_in_retry=[3]) as c:
        kill_and_notify(c, [1], [0, 2, 3])
        kill_and_notify(c, [3], survivors)
        j = finish(c, CFG, survivors, ref4)
    assert replans(j[3])[0]["step"] == 8  # it replanned, then died in the retry
    for u in survivors:
        commits = {e["step"]: e for e in events(j[u], "commit")}
        assert commits[8]["members"] == survivors
        assert commits[CFG.steps - 1]["mine"] == ([0, 1] if u == 0 else [2, 3])


@pytest.mark.timeout(120)
def test_member_that_missed_a_commit_rolls_forward(ref4, tmp_path):
    # group 2 sees step 7's completed all-reduce as failed (as a rank does when a peer dies
    # after sending): its peers committed step 7, it did not. After the re-form the members
    # find they are one step apart and group 2 applies the reduced gradient of a peer.
    with StackedCluster(CFG, str(tmp_path), drop_commit_at={2: 7}) as c:
        j = finish(c, CFG, [0, 1, 2, 3], ref4, tol=1e-9)
    (rf,) = events(j[2], "roll_forward")
    assert rf["step"] == 7
    c7 = [e for e in events(j[2], "commit") if e["step"] == 7]
    assert len(c7) == 1 and c7[0]["rolled"] is True
    # group 2 breaking the generation can catch a peer that was still receiving the op's last
    # chunks: it abandons the op too and is rolled forward the same way; the source is not
    behind = [u for u in (0, 1, 3) if events(j[u], "roll_forward")]
    assert len(behind) < 3 and all(events(j[u], "roll_forward")[0]["step"] == 7 for u in behind)
    for u in (0, 1, 3):
        assert [e["step"] for e in events(j[u], "commit")] == list(range(CFG.steps))
        assert len(events(j[u], "roll_forward")) <= 1


@pytest.mark.timeout(150)
def test_spare_joins_heals_the_layout(ref_join, tmp_path):
    # the communicator's rank 0 (group 0) dies at step 4 and is masked; a warm spare (uid 4)
    # is sent to take over slot 0, joins at a step boundary with a checksummed copy of the
    # state, and the plan returns to depth 1 (redundancy restored)
    finishers = [1, 2, 3, 4]
    with StackedCluster(CFG_JOIN, str(tmp_path), die_at={0: 4}, spares=1) as c:
        kill_and_notify(c, [0], [1, 2, 3])
        c.assign(4, 0)
        j = finish(c, CFG_JOIN, finishers, ref_join)
    (adm,) = events(j[1], "admit")
    k = adm["step"]
    assert 4 < k < CFG_JOIN.steps and adm["joined"] == {"4": 0}
    (joined,) = events(j[4], "joined")
    assert joined["step"] == k and joined["slot"] == 0
    assert [e["step"] for e in events(j[4], "commit")] == list(range(k, CFG_JOIN.steps))
    for u in finishers:
        last = events(j[u], "commit")[-1]
        assert last["mine"] == [0 if u == 4 else u]  # back to plain DP, each its own type
        assert last["members"] == [1, 2, 3, 4]


@pytest.mark.timeout(150)
def test_corrupt_snapshot_is_refused_and_the_next_copy_used(ref_join, tmp_path):
    # group 1 dies and a spare replaces it; the first member to serve the state (uid 0) sends a
    # copy with a flipped byte: the joiner's checksum refuses it and uid 2's copy is used
    with StackedCluster(CFG_JOIN, str(tmp_path), die_at={1: 4}, spares=1,
                        corrupt_snapshot=[0]) as c:
        kill_and_notify(c, [1], [0, 2, 3])
        c.assign(4, 1)
        j = finish(c, CFG_JOIN, [0, 2, 3, 4], ref_join)
    (bad,) = events(j[4], "bad_snapshot")
    assert bad["from"] == 0 and "checksum" in bad["error"]


@pytest.mark.timeout(150)
def test_wipeout_restarts_from_snapshot_with_replacements(ref4, tmp_path):
    # groups 1 (types 1, 2) and 2 (types 2, 3) die together at step 10: type 2 lost both
    # hosts. Survivors 0 and 3 wait; two spares take slots 1 and 2, receive the snapshot of
    # step 9's committed state, and step 10 is computed again by the full layout.
    finishers = [0, 3, 4, 5]
    with StackedCluster(CFG, str(tmp_path), die_at={1: 10, 2: 10}, spares=2) as c:
        kill_and_notify(c, [1, 2], [0, 3])
        for u in (0, 3):
            assert c.wait_key(f"wipeout/{u}", 60, alive=[0, 3])["dead_slots"] == [1, 2]
        c.assign(4, 1)
        c.assign(5, 2)
        j = finish(c, CFG, finishers, ref4)
    for u in (0, 3):
        (w,) = events(j[u], "wipeout")
        assert w["step"] == 10 and w["lost_types"] == [2]
        (r,) = events(j[u], "restart")
        assert r["step"] == 10 and r["source"] == "memory" and r["joined"] == {"4": 1, "5": 2}
    for u in (4, 5):
        assert events(j[u], "commit")[0]["step"] == 10


@pytest.mark.timeout(120)
def test_wipeout_without_replacements_exits_4(tmp_path):
    with StackedCluster(CFG, str(tmp_path), die_at={1: 10, 2: 10}, wipeout_wait=2.0) as c:
        kill_and_notify(c, [1, 2], [0, 3])
        for u in (0, 3):
            reason = c.wait_key(f"wipeout_failed/{u}", 60, alive=[u])
            assert "no replacement for slots [1, 2]" in reason and "(2)" in reason, reason
            assert c.procs[u].wait(timeout=30) == 4


@pytest.mark.timeout(150)
def test_admission_while_a_member_recovers_settles_one_way(ref_join, tmp_path):
    # group 0 dies and a spare (uid 4) is sent to slot 0. Group 2 treats the completed
    # all-reduce of the step whose commit makes its peers admit the spare as failed: its
    # peers commit and re-form (planned) with the joiner while it re-forms to recover. The
    # settle, the first collective of the new generation, sends them all one way: group 2
    # is rolled forward, the spare gets the state, everyone takes the same fresh plan.
    finishers = [1, 2, 3, 4]
    with StackedCluster(CFG_JOIN, str(tmp_path), die_at={0: 4}, spares=1,
                        drop_commit_on_join=[2]) as c:
        kill_and_notify(c, [0], [1, 2, 3])
        c.assign(4, 0)
        j = finish(c, CFG_JOIN, finishers, ref_join, tol=1e-9)
    (rf,) = events(j[2], "roll_forward")
    (adm,) = events(j[1], "admit")
    assert adm["joined"] == {"4": 0} and rf["step"] == adm["step"] - 1
    assert events(j[2], "admit") == [] or events(j[2], "admit")[0]["step"] == adm["step"]
    (joined,) = events(j[4], "joined")
    assert joined["step"] == adm["step"]
    for u in finishers:
        steps = [e["step"] for e in events(j[u], "commit")]
        assert steps == sorted(set(steps)) and steps[-1] == CFG_JOIN.steps - 1
        assert events(j[u], "commit")[-1]["mine"] == [0 if u == 4 else u]
