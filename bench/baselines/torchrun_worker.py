"""One rank of plain data parallelism under ``torch.distributed.run`` (torchrun) with a
checkpoint every step; used by ``bench/kill_baselines.py``.

The same model as the stacked runner (``make_trainer(cfg)``). Per step: the gradient of shard
type ``RANK``, ONE ``dist.all_reduce`` (SUM) of the flat gradient on the default gloo group,
``trainer.apply`` (the trainer takes the sum of the N shard-type gradients), then rank 0 saves
``{step, state_tensors}`` with ``torch.save`` to a temp file + ``os.replace`` and every rank
appends ``{"step", "t", "attempt"}`` (``t = time.time()`` after the step is committed, i.e.
applied and, on rank 0, checkpointed) to ``<out>/tr-<rank>.jsonl``. Before the next step a
``dist.barrier`` makes sure the checkpoint of the previous step is on disk before anyone
proceeds, so a restart resumes exactly after the last committed step.

Fault injection: ``--die-at K --die-rank R`` on the first attempt (``TORCHELASTIC_RESTART_COUNT
== 0``): rank R writes the wall time to ``<out>/killed`` and SIGKILLs itself after computing the
step-K gradient, before its all-reduce (the same point as the stacked worker's ``--die-at``).
The elastic agent sees the failure, stops the other workers and restarts all four; they load
the checkpoint and continue. ``--steps`` is the total number of steps to train.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--die-at", type=int, default=None)
    ap.add_argument("--die-rank", type=int, default=1)
    ap.add_argument("--pg-timeout-s", type=float, default=30.0)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist

    from unbroken.runtime.config import TrainConfig
    from unbroken.runtime.trainer import make_trainer

    t_start = time.time()
    torch.set_num_threads(1)
    cfg = TrainConfig.from_json(a.config)
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # The agent's store outlives a restart; the restarted workers' gloo init under the default
    # (env://) store read the dead attempt's rank addresses ("connectFullMesh failed ...
    # Connection refused"), so each attempt inits the PG under its own store prefix.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=a.pg_timeout_s))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                            rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=a.pg_timeout_s))
    tr = make_trainer(cfg)
    start = 0
    if os.path.exists(a.ckpt):
        ck = torch.load(a.ckpt, weights_only=True)
        with torch.no_grad():
            for t, v in zip(tr.state_tensors(), ck["state"]):
                t.copy_(v)
        start = ck["step"] + 1
    jf = open(os.path.join(a.out, f"tr-{rank}.jsonl"), "a", buffering=1)
    jf.write(json.dumps({"event": "start", "attempt": attempt, "resume_step": start,
                         "t_proc_start": t_start, "t": time.time()}) + "\n")
    for k in range(start, cfg.steps):
        g = tr.grad(k, rank)
        if a.die_at == k and rank == a.die_rank and attempt == 0:
            with open(os.path.join(a.out, "killed"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(g, op=dist.ReduceOp.SUM)
        tr.apply(g)
        if rank == 0:
            tmp = a.ckpt + ".tmp"
            torch.save({"step": k, "state": [t.detach().clone() for t in tr.state_tensors()]},
                       tmp)
            os.replace(tmp, a.ckpt)
        dist.barrier()  # the checkpoint of step k is durable before anyone starts step k+1
        jf.write(json.dumps({"event": "commit", "step": k, "attempt": attempt,
                             "t": time.time()}) + "\n")
    jf.close()
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
