"""Worker entry point for stacked data-parallel training, and its local launcher.

``python -m unbroken.runtime.stacked_worker --uid U --port P --config JSON --journal DIR``
runs :class:`~unbroken.runtime.stacked.StackedRunner` for group ``U`` over an ``FTComm`` whose
store the launcher hosts. It writes ``DIR/group-U.jsonl`` (one line per event, flushed at once,
so a SIGKILLed group's committed steps survive it) and reports through the store:

* ``done/<uid>``: ``{"params": [...], "steps"}`` at the end (then waits for the other
  members' ``done`` so nobody leaves a peer inside the last collective);
* ``wipeout/<uid>``: the reason (a JSON string), exit code 4 (no masking possible; the
  restart from the snapshot comes next);
* ``error/<uid>``: a traceback, exit code 3;
* ``killed/<uid>``: wall time just before a ``--die-at STEP`` self-SIGKILL (fault injection at
  a deterministic point: after the step's gradients, before its all-reduce), or before a
  ``--die-after-replan`` self-SIGKILL (right after this group journaled its first replan: the
  new generation is formed and its patch computed, its retry all-reduce not yet issued);
* ``stopped/<uid>``: wall time just before a ``--stop-at STEP`` self-SIGSTOP (a hang at the
  same point as ``--die-at``; the group stays stopped, nobody posts a death notice; if it is
  ever continued it SIGKILLs itself).

``StackedCluster`` reuses :class:`~unbroken.runtime.ftcomm_worker.LocalCluster` (store hosting,
waiting on keys and process exits, kill, close) and only starts this worker instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

from unbroken.runtime.ftcomm_worker import LocalCluster, finish, hard_exit, report_error


def worker_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--uid", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--config", required=True, help="TrainConfig as JSON")
    ap.add_argument("--journal", required=True, help="directory for group-<uid>.jsonl")
    ap.add_argument("--die-at", type=int, default=None)
    ap.add_argument("--stop-at", type=int, default=None)
    ap.add_argument("--die-after-replan", action="store_true")
    ap.add_argument("--heartbeat", type=float, default=0.1)
    ap.add_argument("--staleness", type=float, default=1.0)
    ap.add_argument("--pg-timeout", type=float, default=30.0)
    a = ap.parse_args(argv)

    import torch

    from unbroken.runtime.ftcomm import FTComm
    from unbroken.runtime.stacked import StackedRunner, TrainConfig, WipeOutError

    torch.set_num_threads(1)
    cfg = TrainConfig.from_json(a.config)
    comm = None
    code = 0
    jf = open(os.path.join(a.journal, f"group-{a.uid}.jsonl"), "a", buffering=1)

    def journal(ev: dict) -> None:
        jf.write(json.dumps(ev) + "\n")  # line-buffered: in the kernel before the next step
        if a.die_after_replan and ev.get("event") == "replan" and comm is not None:
            comm.store.set(f"killed/{a.uid}", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    def on_fault() -> None:
        if a.stop_at is not None:
            st.set(f"stopped/{a.uid}", repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)  # the whole process, heartbeat thread included
        else:
            st.set(f"killed/{a.uid}", repr(time.time()))

    try:
        comm = FTComm(a.uid, list(range(cfg.groups)), host=a.host, port=a.port,
                      heartbeat_period=a.heartbeat, staleness=a.staleness,
                      pg_timeout=a.pg_timeout)
        st = comm.store
        fault_at = a.die_at if a.stop_at is None else a.stop_at
        runner = StackedRunner(cfg, a.uid, comm, journal, die_at=fault_at, on_die=on_fault)
        params = runner.run()
        finish(comm, a.uid, {"params": params.tolist(), "steps": runner.step,
                             "journal": comm.journal})
    except WipeOutError as exc:
        code = 4
        if comm is not None:
            comm.store.set(f"wipeout/{a.uid}", json.dumps(str(exc)))
    except BaseException:
        code = report_error(comm, a.uid)
    jf.close()
    hard_exit(code)


class StackedCluster(LocalCluster):
    """``LocalCluster`` that starts stacked training workers.

    ``die_at`` / ``stop_at``: uid -> step of a self-SIGKILL / self-SIGSTOP; ``die_after_replan``:
    uids that SIGKILL themselves right after their first replan.
    """

    def __init__(self, cfg, journal_dir: str, *, die_at: dict[int, int] | None = None,
                 stop_at: dict[int, int] | None = None,
                 die_after_replan: tuple[int, ...] | list[int] = (),
                 heartbeat: float = 0.1, staleness: float = 1.0, pg_timeout: float = 30.0,
                 python: str | None = None) -> None:
        import torch.distributed as dist

        self.uids = list(range(cfg.groups))
        self.journal_dir = journal_dir
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=60))
        self.port = self.store.port
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        self.procs = {}
        self._errs = {}
        for u in self.uids:
            cmd = [python or sys.executable, "-m", "unbroken.runtime.stacked_worker",
                   "--uid", str(u), "--port", str(self.port), "--config", cfg.to_json(),
                   "--journal", journal_dir, "--heartbeat", str(heartbeat),
                   "--staleness", str(staleness), "--pg-timeout", str(pg_timeout)]
            if die_at and u in die_at:
                cmd += ["--die-at", str(die_at[u])]
            if stop_at and u in stop_at:
                cmd += ["--stop-at", str(stop_at[u])]
            if u in die_after_replan:
                cmd += ["--die-after-replan"]
            err = tempfile.TemporaryFile()
            self.procs[u] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
            self._errs[u] = err

    def journal(self, uid: int) -> list[dict]:
        path = os.path.join(self.journal_dir, f"group-{uid}.jsonl")
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    worker_main()
