"""Incidents the step check finds in-band, and the guard's verdicts carried out by the runtime.

Every member reads the same reduced buffer, so a member's step error, a non-finite sum and a
bitwise disagreement between two hosts of a shard type are seen by all of them at the same
step; with ``verdicts`` they wait for ``verdict/<step>/<n>``. This test process hosts the store
and plays the guard: it reads ``incident/...`` / ``replay/...`` keys and posts verdicts. Real
processes, real SIGKILL for the evicted culprit; synchronisation by store keys and exits only.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from helpers import events as evs  # noqa: E402
from helpers import finish, wait_while_alive  # noqa: E402

from unbroken.core.replay import majority_culprits  # noqa: E402
from unbroken.runtime.ftcomm import declare_dead  # noqa: E402
from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.trainer import reference_run  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

pytestmark = pytest.mark.mp

CFG = TrainConfig(groups=4, redundancy=2, steps=20, seed=3, sdc_every=4)
ALL = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def ref():
    return reference_run(CFG)


def post(c: StackedCluster, key: str, obj: dict) -> None:
    c.store.set(key, json.dumps(obj))


@pytest.mark.timeout(120)
def test_nan_is_seen_at_its_step_and_a_retry_recomputes_it(ref, tmp_path):
    with StackedCluster(CFG, str(tmp_path), nan_at={1: 6}, verdicts=True) as c:
        inc = c.wait_key("incident/6/0", 60, alive=ALL)
        # the one NaN injected into one gradient element: one non-finite element of the sum
        assert inc["kind"] == "implicit" and inc["nonfinite"] == 1
        post(c, "verdict/6/0", {"action": "retry"})
        j = finish(c, CFG, ALL, ref, tol=1e-9)
    for u in ALL:  # every member saw it at step 6, none committed a NaN
        assert [(e["kind"], e["step"]) for e in evs(j[u], "incident")] == [("implicit", 6)]
        assert all(e["loss"] == e["loss"] for e in evs(j[u], "commit"))
    # the passing redundant checks ran at steps 3, 7, 11, ...
    assert [e["step"] for e in evs(j[0], "sdc_check")] == [3, 7, 11, 15, 19]


@pytest.mark.timeout(150)
def test_bit_flip_found_by_the_check_named_by_replay_evicted_and_rolled_back(ref, tmp_path):
    ckpt = tmp_path / "ckpt"
    with StackedCluster(CFG, str(tmp_path), flip_from={2: 9}, verdicts=True,
                        ckpt_dir=str(ckpt), ckpt_every=4) as c:
        inc = c.wait_key("incident/11/0", 60, alive=ALL)  # first check after the flip
        assert inc["kind"] == "sdc"
        bad = sorted(int(t) for t in inc["mismatch"])
        assert all("2" in hosts for hosts in inc["mismatch"].values())  # slot 2 in each pair
        # first pass: the guard rolls back without naming anyone (an inconclusive replay)
        post(c, "verdict/11/0", {"action": "replay", "types": bad})
        c.wait_key("replay/11/0", 60, alive=ALL)
        post(c, "verdict/11/1", {"action": "restore", "step": 8})
        # the recomputed step 11 mismatches again: a new incident, not the answered verdicts
        # of the first pass (reading those again replayed and restored forever)
        inc = c.wait_key("incident/11/2", 60, alive=ALL)
        assert inc["kind"] == "sdc" and sorted(int(t) for t in inc["mismatch"]) == bad
        post(c, "verdict/11/2", {"action": "replay", "types": bad})
        rep = c.wait_key("replay/11/2", 60, alive=ALL)
        digests = {int(t): {int(w): d for w, d in ds.items()} for t, ds in rep["digests"].items()}
        culprits, why = majority_culprits(digests)
        assert culprits == (2,), why
        c.procs[2].kill()
        assert c.procs[2].wait(timeout=10) == -9
        declare_dead(c.store, 2)
        post(c, "verdict/11/3", {"action": "restore", "step": 8})  # verified at check step 7
        j = finish(c, CFG, [0, 1, 3], ref, tol=1e-9)
    for u in (0, 1, 3):
        assert [e["step"] for e in evs(j[u], "restore")] == [8, 8]
        assert max(e["step"] for e in evs(j[u], "commit")) == CFG.steps - 1
    # the corrupted steps 9..10 were committed twice, then rolled back and redone masked
    assert [e["step"] for e in evs(j[0], "commit")].count(9) == 3


@pytest.mark.timeout(120)
def test_bad_hot_update_raises_everywhere_and_a_rollback_recovers(ref, tmp_path):
    with StackedCluster(CFG, str(tmp_path), verdicts=True) as c:
        post(c, "code/1", {"version": "v1", "model": "unbroken.testing.updates:bad_mlp"})
        c.store.add("code/count", 1)  # applied at the next step boundary by every member
        # which boundary depends on how far the workers got before the record was posted
        # (a few steps in a long test session: waiting for step 1's key hung here)
        wait_while_alive(lambda: evs(c.journal(0), "incident"), [c.procs[u] for u in ALL], 60)
        k = evs(c.journal(0), "incident")[0]["step"]
        inc = c.wait_key(f"incident/{k}/0", 60, alive=ALL)
        assert inc["kind"] == "code" and inc["errors"] == 4 and inc["version"] == "v1"
        post(c, "code/2", {"version": "v0", "model": "mlp"})
        post(c, "verdict/%d/0" % k, {"action": "retry", "code": 2})
        j = finish(c, CFG, ALL, ref, tol=1e-9)
    for u in ALL:
        assert [(e["from"], e["to"]) for e in evs(j[u], "code")] == [("v0", "v1"),
                                                                     ("v1", "v0")]
        err = evs(j[u], "step_error")
        assert len(err) == 1 and "invalid for input of size" in err[0]["error"]


@pytest.mark.timeout(120)
def test_a_stop_verdict_exits_with_the_no_progress_code(tmp_path):
    with StackedCluster(CFG, str(tmp_path), nan_at={0: 3}, verdicts=True) as c:
        c.wait_key("incident/3/0", 60, alive=ALL)
        post(c, "verdict/3/0", {"action": "stop", "reason": "ladder gave up"})
        assert [c.procs[u].wait(timeout=30) for u in ALL] == [6, 6, 6, 6]


@pytest.mark.timeout(120)
def test_log_only_journals_the_nan_and_lets_it_poison_the_run(tmp_path):
    cfg = TrainConfig(groups=4, redundancy=2, steps=8, seed=3)
    with StackedCluster(cfg, str(tmp_path), nan_at={1: 2}) as c:
        done = {u: c.wait_key(f"done/{u}", 90, alive=ALL) for u in ALL}
        j = {u: c.journal(u) for u in ALL}
    assert [e["step"] for e in evs(j[0], "incident")] == list(range(2, 8))
    assert all(v != v for v in done[0]["params"][:3])  # what no guard means: NaN params
