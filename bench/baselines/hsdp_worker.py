"""One rank of torch's own HSDP: FSDP2 ``fully_shard`` on a 2-D mesh (replicate = G groups,
shard = R ranks), the baseline ``bench/rank_groups.py`` runs beside unbroken's groups of ranks.

``python hsdp_worker.py --config JSON --port P --rank K --world W --out FILE``: the same model,
data and optimizer as unbroken's worker (``make_trainer(cfg)``; replica g computes shard type
g of every step, its rank j part j of the shard's samples, as unbroken's FSDP groups do), one
``loss.backward()`` per step (FSDP2 reduce-scatters inside a replica and all-reduces across
replicas: the mean over the N shard types), one optimizer step. Rank 0 writes every step's
commit time and, at the end, the whole model's parameters to FILE (JSON), so the bench can
check that both runs computed the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from unbroken.runtime.config import TrainConfig
    from unbroken.runtime.sharding import rebuilt_optimizer
    from unbroken.runtime.trainer import make_trainer

    torch.set_num_threads(1)
    cfg = TrainConfig.from_json(a.config)
    g, r = cfg.groups, cfg.ranks_per_group
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank,
                            world_size=a.world)
    mesh = init_device_mesh("cpu", (g, r), mesh_dim_names=("replicate", "shard"))
    tr = make_trainer(cfg)
    old = list(tr.model.parameters())
    fully_shard(tr.model, mesh=mesh)  # a 2-D mesh: HSDP
    params = list(tr.model.parameters())
    opt = rebuilt_optimizer(tr.opt, old, params)
    replica, part = a.rank // r, a.rank % r
    times = []
    for k in range(cfg.steps):
        loss = tr.loss(k, replica, (part, r))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.time())
    full = torch.cat([p.full_tensor().detach().reshape(-1).to(torch.float64) for p in params])
    if a.rank == 0:
        with open(a.out, "w") as f:
            json.dump({"t": times, "params": full.tolist()}, f)
    dist.barrier()
    os._exit(0)  # not the interpreter's exit: it can abort in a gloo thread still running


if __name__ == "__main__":
    main()
