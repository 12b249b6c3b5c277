"""Durable checkpoints of groups of several ranks are torch DCP by name, so they reshard: a run
of 4 groups x 2 FSDP ranks resumes as 4 groups of one rank (the same trajectory, to float64
rounding) and as 2 groups of 2 ranks. Real processes, gloo on CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import events  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

pytestmark = pytest.mark.mp

BASE = dict(redundancy=2, steps=12, seed=7)


def _run(cfg: TrainConfig, tmp, ckpt, resume: bool = False) -> dict[int, dict]:
    uids = list(range(cfg.groups))
    tmp.mkdir()
    with StackedCluster(cfg, str(tmp), ckpt_dir=str(ckpt), ckpt_every=6, resume=resume) as c:
        done = {u: c.wait_key(f"done/{u}", 120, alive=uids) for u in uids}
        for u in uids:
            assert c.procs[u].wait(timeout=30) == 0, c.stderr(u)[-2000:]
        return {u: {"params": done[u]["params"], "journal": c.journal(u)} for u in uids}


@pytest.fixture(scope="module")
def sharded_checkpoint(tmp_path_factory):
    """A G=4, R=2 fsdp run of 12 steps whose newest checkpoint is then cut back to step 6 (as
    if the job had stopped there)."""
    root = tmp_path_factory.mktemp("sharded")
    ckpt = root / "ckpt"
    _run(TrainConfig(groups=4, ranks_per_group=2, shard="fsdp", **BASE), root / "run", ckpt)
    kept = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert kept == ["step-00000006"], kept  # written by one group's ranks together
    files = sorted(p.name for p in (ckpt / "step-00000006").iterdir())
    assert "__0_0.distcp" in files and "__1_0.distcp" in files, files  # a file per rank
    return ckpt


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.timeout(240)
def test_a_two_rank_checkpoint_resumes_on_one_rank_on_the_same_trajectory(
        sharded_checkpoint, tmp_path):
    import torch

    ckpt = _copy(sharded_checkpoint, tmp_path / "ckpt")
    one = TrainConfig(groups=4, **BASE)
    resumed = _run(one, tmp_path / "resumed", ckpt, resume=True)
    plain = _run(one, tmp_path / "plain", tmp_path / "plain-ckpt")  # failure-free, R = 1
    for u, r in resumed.items():
        (restore,) = events(r["journal"], "restore")
        assert restore["step"] == 6 and restore["source"] == "checkpoint"
        assert [e["step"] for e in events(r["journal"], "commit")][0] == 6
        diff = (torch.tensor(r["params"]) - torch.tensor(plain[u]["params"])).abs().max()
        assert float(diff) < 1e-9, (u, float(diff))


@pytest.mark.timeout(240)
def test_a_checkpoint_of_four_groups_resumes_as_two_groups_of_two_ranks(
        sharded_checkpoint, tmp_path):
    ckpt = _copy(sharded_checkpoint, tmp_path / "ckpt")
    # two groups cannot host two shard types each (SPARe's layout needs N >= 2r - 1); the
    # checkpoint does not depend on it
    two = TrainConfig(groups=2, ranks_per_group=2, shard="fsdp", **{**BASE, "redundancy": 1})
    resumed = _run(two, tmp_path / "resumed", ckpt, resume=True)
    for r in resumed.values():
        (restore,) = events(r["journal"], "restore")
        assert restore["step"] == 6
        steps = [e["step"] for e in events(r["journal"], "commit")]
        assert steps == list(range(6, 12))
    assert resumed[0]["params"] == resumed[1]["params"]
