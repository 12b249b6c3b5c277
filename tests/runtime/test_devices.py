"""Which GPU a worker process takes (``TrainConfig.local_device``): NCCL refuses two ranks of one
communicator on one GPU, so ``--device cuda`` gives each process of a machine its own."""

from __future__ import annotations

import pytest

from unbroken.runtime.config import TrainConfig


def test_one_gpu_a_process_in_group_then_rank_order():
    cfg = TrainConfig(groups=4, ranks_per_group=2, shard="fsdp", device="cuda")
    got = [cfg.local_device(u, k, 8) for u in range(4) for k in range(2)]
    assert got == [f"cuda:{i}" for i in range(8)]
    assert cfg.local_device(4, 1, 8) == "cuda:1"  # a spare group wraps around
    assert TrainConfig(groups=2, device="cuda").local_device(1, 0, 2) == "cuda:1"
    assert cfg.backend == "nccl" and TrainConfig().backend == "gloo"


def test_a_named_device_and_the_cpu_are_kept_and_no_gpu_is_an_error():
    assert TrainConfig(device="cuda:3").local_device(5, 0, 8) == "cuda:3"
    assert TrainConfig().local_device(5, 0, 0) == "cpu"
    with pytest.raises(ValueError, match="no CUDA device"):
        TrainConfig(device="cuda").local_device(0, 0, 0)
