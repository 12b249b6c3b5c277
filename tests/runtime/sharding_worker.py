"""One rank of a group of R ranks that trains the MLP sharded with FSDP2 or TP and computes all
N shard types itself (no other group): ``python sharding_worker.py HOW RANK R PORT OUT``.
Rank 0 writes the whole model's final parameters (``full_params``) to OUT as JSON."""

import json
import os
import sys

import torch
import torch.distributed as dist


def main(how: str, rank: int, ranks: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks)
    from unbroken.runtime.config import TrainConfig
    from unbroken.runtime.sharding import ShardedTrainer, group_mesh
    from unbroken.runtime.trainer import make_trainer

    cfg = TrainConfig(groups=4, redundancy=2, steps=6, seed=3, ranks_per_group=ranks, shard=how)
    tr = ShardedTrainer(make_trainer(cfg), how, group_mesh(ranks))
    for k in range(cfg.steps):
        tr.apply(sum(tr.grad(k, t) for t in range(cfg.groups)))
    full = tr.full_params()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"params": full.tolist(), "local_numel": tr.numel,
                       "loss": tr.last_loss}, f)
    # as the real workers leave (runtime.ftcomm_worker.hard_exit): an interpreter's normal exit
    # can abort in a gloo thread still running ("terminate called without an active
    # exception", seen once in 8 processes x 3 runs)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    how, rank, ranks, port, out = sys.argv[1:]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main(how, int(rank), int(ranks), int(port), out)
