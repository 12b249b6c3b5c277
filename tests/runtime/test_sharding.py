"""runtime.sharding: a group's model sharded over its ranks by torch's own FSDP2 and tensor
parallelism (real processes, gloo) trains exactly like one process, and bad shardings are one
line each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.sharding import ShardingError, ShardedTrainer  # noqa: E402
from unbroken.runtime.trainer import make_trainer, reference_run, share  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "sharding_worker.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.mp
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how,ranks", [("fsdp", 2), ("tp", 2), ("fsdp", 4)])
def test_a_sharded_group_trains_the_unsharded_trajectory(tmp_path, how, ranks):
    out, port = tmp_path / "out.json", _port()
    procs = [subprocess.Popen([sys.executable, WORKER, how, str(k), str(ranks), str(port),
                               str(out)], stderr=subprocess.PIPE) for k in range(ranks)]
    for p in procs:
        _, err = p.communicate(timeout=110)
        assert p.returncode == 0, err.decode()[-2000:]
    got = json.loads(out.read_text())
    ref = reference_run(TrainConfig(groups=4, redundancy=2, steps=6, seed=3))
    full = torch.tensor(got["params"], dtype=torch.float64)
    assert full.shape == ref.shape
    # FSDP2 averages R sub-batch gradients where one process sums one batch: float64
    # rounding only
    assert float((full - ref).abs().max()) < 1e-12
    # each rank holds a part, not the whole model
    assert got["local_numel"] < ref.numel()


def test_share_splits_a_shard_into_equal_contiguous_parts():
    idx = list(range(10, 18))
    assert [share(idx, (k, 4)) for k in range(4)] == [[10, 11], [12, 13], [14, 15], [16, 17]]
    assert share(idx, (0, 1)) == idx


class _Mesh:
    """Just enough of a DeviceMesh for the checks made before any collective."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks

    def __getitem__(self, name: str) -> "_Mesh":
        return self

    def size(self) -> int:
        return self.ranks

    def get_local_rank(self) -> int:
        return 0


def test_fsdp_needs_a_shard_of_samples_that_splits_evenly():
    tr = make_trainer(TrainConfig(shard_size=6, ranks_per_group=4, shard="fsdp"))
    with pytest.raises(ShardingError, match="--shard-size 6 is not divisible by "
                                            "--ranks-per-group 4"):
        ShardedTrainer(tr, "fsdp", _Mesh(4))


def test_tp_needs_a_width_that_splits_evenly_and_a_plan():
    tr = make_trainer(TrainConfig(ranks_per_group=3, shard="tp", trainer_args={"hidden": 16}))
    with pytest.raises(ShardingError, match="hidden width 16 is not divisible by "
                                            "--ranks-per-group 3"):
        ShardedTrainer(tr, "tp", _Mesh(3))
    tr.tp_plan = None
    with pytest.raises(ShardingError, match="has no tensor parallel plan"):
        ShardedTrainer(tr, "tp", _Mesh(3))
