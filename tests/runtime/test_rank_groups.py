"""Groups of several ranks (the model sharded inside each group by torch's FSDP2 or tensor
parallelism, SPARe across groups): a kill, a hang and a wipe-out, each hitting one rank of a
group, are each the whole group's failure -- fenced, masked by the survivors' replan, and
replaced by a spare group that copies the state shard by shard.

Real processes, gloo on CPU, real SIGKILL/SIGSTOP injected by the victim rank itself at an
exact step. The test plays the launcher: it waits for the victim (store keys, process exits,
never sleeps), posts the death notice and assigns the spare groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers import events, finish  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.ftcomm import declare_dead  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

pytestmark = pytest.mark.mp

STEPS = 60


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory):
    """The parameters and step losses of a failure-free run with one rank a group (the runtime
    as it is for R = 1) and the same seed."""
    import torch

    cfg = TrainConfig(groups=4, redundancy=2, steps=STEPS, seed=5)
    with StackedCluster(cfg, str(tmp_path_factory.mktemp("r1"))) as c:
        done = {u: c.wait_key(f"done/{u}", 90, alive=list(range(4))) for u in range(4)}
        losses = {e["step"]: e["loss"] for e in events(c.journal(0), "commit")}
    return torch.tensor(done[0]["params"], dtype=torch.float64), losses


def _rank_journal(c, uid, rank):
    path = Path(c.journal_dir) / (f"rank-{uid}.{rank}.jsonl" if rank else f"group-{uid}.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _lost_by(c, uid, rank):
    """Group ``uid`` is lost because its rank ``rank`` was killed: the group's status is that
    rank's SIGKILL, or -- when its siblings' own exits reached the launcher first -- their
    fence (exit 11), whose journaled reason then names that rank (a starved launcher or
    fork server read the siblings' statuses first in a CI run beside a busy loop: both
    arrive through the fork server, and either is the group's loss)."""
    status = c.procs[uid].wait(timeout=10)
    if status == -9:
        assert c.procs[uid].failed_rank == rank
        return
    assert status == 11, status
    fenced = [e for k in range(c.cfg.ranks_per_group)
              for e in events(_rank_journal(c, uid, k), "group_fenced")]
    assert fenced and all(e.get("sibling") == rank or "collective" in e["reason"]
                          for e in fenced), fenced


def _ranks_of(c, uid):
    return c.procs[uid].procs


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shard,ranks", [("fsdp", 2), ("fsdp", 4), ("tp", 2)])
def test_a_rank_killed_hung_or_wiped_out_fails_its_whole_group_and_nothing_is_lost(
        one_rank_run, tmp_path, shard, ranks):
    import torch

    cfg = TrainConfig(groups=4, redundancy=2, steps=STEPS, seed=5, ranks_per_group=ranks,
                      shard=shard)
    last = ranks - 1
    # step 4: group 1's last rank is SIGKILLed; step 12: group 3's rank 0 SIGSTOPs itself;
    # step 24: the spare that took slot 1 (uid 4, rank 0) and group 2 (its last rank) die
    # together: slots 1 and 2 host shard type 2 both, a wipe-out
    with StackedCluster(cfg, str(tmp_path), die_at={1: 4, 4: 24, 2: 24}, stop_at={3: 12},
                        fault_rank={1: last, 3: 0, 4: 0, 2: last}, spares=4) as c:
        c.wait_key("killed/1", 60, alive=[0, 2, 3])
        _lost_by(c, 1, last)
        # fenced: no rank of the group is left to block its collectives
        assert all(p.poll() is not None for p in _ranks_of(c, 1))
        declare_dead(c.store, 1)
        c.assign(4, 1)

        c.wait_key("stopped/3", 60, alive=[0, 2, 4])
        # the stopped rank's sibling found it silent, declared the group dead and left
        # (GROUP_FENCED); the launcher then killed the stopped rank
        assert c.procs[3].wait(timeout=30) == 11
        assert [p.poll() for p in _ranks_of(c, 3)][0] == -9
        # ... and journaled why before it left: rank 0 silent
        fenced = [e for k in range(1, ranks) for e in events(_rank_journal(c, 3, k),
                                                              "group_fenced")]
        assert fenced and all(e["sibling"] == 0 and "silent" in e["reason"] for e in fenced), \
            fenced
        declare_dead(c.store, 3)
        c.assign(5, 3)

        for v in (4, 2):
            c.wait_key(f"killed/{v}", 60, alive=[0, 5])
            _lost_by(c, v, {4: 0, 2: last}[v])
            declare_dead(c.store, v)
        c.assign(6, 1)
        c.assign(7, 2)
        fin = [0, 5, 6, 7]
        # every gradient exactly once, every finisher within 1e-6 of the single-process
        # reference (helpers.finish)
        j = finish(c, cfg, fin, _reference(cfg), wait_s=120)
        params = {u: c.wait_key(f"done/{u}", 5, alive=fin)["params"] for u in fin}
        every = [p for g in c.procs.values() for p in getattr(g, "procs", [g])]
    assert all(p.poll() is not None for p in every)  # no orphan: every rank of every group
    for u in fin:
        # the same run with one rank a group, to float64 rounding (FSDP2 averages the ranks'
        # parts of a shard where one process sums the shard)
        diff = (torch.tensor(params[u], dtype=torch.float64) - one_rank_run[0]).abs().max()
        assert float(diff) < 1e-9, (u, float(diff))
    # the step's loss is the group's (the mean of its ranks' parts), as with one rank a group
    for e in events(j[0], "commit"):
        if e["step"] < 4:
            assert abs(e["loss"] - one_rank_run[1][e["step"]]) < 1e-12, e
    # the kill and the hang were masked by replan, the wipe-out restarted from memory
    replans = [e for e in events(j[0], "replan") if e["patch"]]
    assert [e["step"] for e in replans][:2] == [4, 12], replans
    assert {e["step"] for e in events(j[0], "wipeout")} == {24}
    admitted = {int(u) for e in events(j[0], "admit") + events(j[0], "restart")
                for u in e["joined"]}
    assert admitted == {4, 5, 6, 7}


@pytest.mark.timeout(120)
def test_a_nan_on_one_rank_is_the_whole_groups_incident_and_every_groups(tmp_path):
    # group 2's rank 0 puts a NaN in its gradient at step 3: FSDP's reduce-scatter spreads it
    # to both ranks' shards, so both planes' sums are non-finite and both ranks find it; the
    # group's agreement makes it one incident of one kind on every rank of every group
    cfg = TrainConfig(groups=4, redundancy=2, steps=6, seed=5, ranks_per_group=2, shard="fsdp")
    uids = list(range(4))
    with StackedCluster(cfg, str(tmp_path), nan_at={2: 3}, fault_rank={2: 0}) as c:
        for u in uids:
            c.wait_key(f"done/{u}", 60, alive=uids)
        first = {u: next(e for e in events(c.journal(u), "incident")) for u in uids}
    assert {(e["kind"], e["step"]) for e in first.values()} == {("implicit", 3)}


def _reference(cfg):
    from dataclasses import replace

    from unbroken.runtime.trainer import reference_run

    return reference_run(replace(cfg, ranks_per_group=1, shard="none"))
