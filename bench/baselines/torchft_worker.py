"""One torchft replica group (one process) training the project's model; used by
``bench/kill_baselines.py``.

Per step: ``manager.start_quorum()``; the gradient of shard type ``replica`` at the manager's
current step (``make_trainer(cfg).grad``, the same model as the stacked runner); fault injection
(``--die-at K``: at the first step >= K whose quorum holds all N groups, write the wall time
and step to ``killed-<replica>`` and SIGKILL itself after computing the gradient, before its
all-reduce, the same point as the stacked worker's ``--die-at``);
``manager.allreduce(flat_grad, SUM).wait()``; ``manager.should_commit()``; on commit
``trainer.apply(sum * N / participants)`` (the mean over the participating groups, in the
trainer's sum-of-N convention). One JSON line per step in ``<out>/tf-<replica>.jsonl`` with the
wall time (``time.time()``) right after the commit decision.

A TCPStore hosted by the launcher (``--port``) serves as a start barrier (all four Managers are
up and heartbeating before any asks for a quorum, so the first quorum has all four) and as the
stop signal (``stop`` key). The Manager's own store is hosted by this process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--port", type=int, required=True, help="launcher's TCPStore")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--die-at", type=int, default=None)
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--pg-timeout-s", type=float, default=None, help="None: torchft default")
    ap.add_argument("--manager-timeout-s", type=float, default=None)
    ap.add_argument("--quorum-timeout-s", type=float, default=None)
    ap.add_argument("--heartbeat-interval-ms", type=int, default=None)
    ap.add_argument("--min-replica-size", type=int, default=1)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.distributed import ReduceOp
    from torchft import Manager, ProcessGroupGloo

    from unbroken.runtime.config import TrainConfig
    from unbroken.runtime.trainer import make_trainer

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(1)
    cfg = TrainConfig.from_json(a.config)
    n = cfg.groups
    tr = make_trainer(cfg)
    launcher = dist.TCPStore("127.0.0.1", a.port, is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=120))
    own = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                        timeout=timedelta(seconds=120))

    def state_dict() -> dict:
        return {"state": [t.clone() for t in tr.state_tensors()]}

    def load_state_dict(sd: dict) -> None:
        with torch.no_grad():
            for t, v in zip(tr.state_tensors(), sd["state"]):
                t.copy_(v)

    pg_kw = {} if a.pg_timeout_s is None else {"timeout": timedelta(seconds=a.pg_timeout_s)}
    m_kw: dict = {}
    if a.manager_timeout_s is not None:
        m_kw["timeout"] = timedelta(seconds=a.manager_timeout_s)
    if a.quorum_timeout_s is not None:
        m_kw["quorum_timeout"] = timedelta(seconds=a.quorum_timeout_s)
    if a.heartbeat_interval_ms is not None:
        m_kw["heartbeat_interval"] = timedelta(milliseconds=a.heartbeat_interval_ms)
    manager = Manager(pg=ProcessGroupGloo(**pg_kw), load_state_dict=load_state_dict,
                      state_dict=state_dict, min_replica_size=a.min_replica_size, rank=0,
                      world_size=1, store_addr="127.0.0.1", store_port=own.port,
                      lighthouse_addr=a.lighthouse, replica_id=f"replica_{a.replica}",
                      init_sync=False, **m_kw)
    launcher.add("ready", 1)
    launcher.wait(["go"])
    jf = open(os.path.join(a.out, f"tf-{a.replica}.jsonl"), "a", buffering=1)
    for _ in range(a.max_steps):
        if launcher.check(["stop"]):
            break
        manager.start_quorum()
        k = manager.current_step()
        g = tr.grad(k, a.replica)
        if a.die_at is not None and k >= a.die_at:
            # die mid-step, like the stacked worker: after this step's quorum (which includes
            # this group) is formed and the gradient computed, before the all-reduce; and only
            # once all N groups are in the quorum (a late joiner may still be healing)
            manager.wait_quorum()
            if manager.num_participants() == n:
                with open(os.path.join(a.out, f"killed-{a.replica}"), "w") as f:
                    f.write(json.dumps({"t": time.time(), "step": k}))
                os.kill(os.getpid(), signal.SIGKILL)
        ok_ar = manager.allreduce(g, reduce_op=ReduceOp.SUM).wait()
        part = manager.num_participants()
        commit = manager.should_commit()
        t = time.time()
        if commit:
            tr.apply(g * (n / part))
        jf.write(json.dumps({"step": k, "commit": bool(commit), "allreduce_ok": bool(ok_ar),
                             "participants": part, "t": t}) + "\n")
    jf.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no teardown of the manager / gloo threads (a dead peer may hold them)


if __name__ == "__main__":
    main()
