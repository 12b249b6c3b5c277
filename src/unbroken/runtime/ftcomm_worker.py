"""A probe worker for :class:`~unbroken.runtime.ftcomm.FTComm` and a local coordinator.

The worker (``python -m unbroken.runtime.ftcomm_worker --uid U --members 0,1,2,3 --port P``)
all-reduces ``full(n, uid + 1)`` in a loop; a failed op is retried after ``reform()`` (a member
left one step behind by an op its peers completed takes that step's result from them), so every
step index completes exactly once per survivor. It reports through the store that the
coordinator hosts:

* ``result/<uid>/<step>``: ``{"gen", "members", "value", "uniform", "t"}`` (value = element 0 of
  the sum, which must equal ``sum(m + 1 for m in members)``);
* ``first/<uid>/<gen>``: the first result completed in generation ``gen`` (>= 1);
* ``done/<uid>``: ``{"steps", "journal"}`` when it stops (key ``stop`` set; the first worker
  to see it fixes ``stop_at`` a few steps ahead so all stop at the same step), or
  ``error/<uid>`` with a traceback. It leaves with ``os._exit``.

``LocalCluster`` is the coordinator: it hosts the TCPStore (so any worker may die), starts the
workers as real processes, and waits on store keys or process exits, never on sleeps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any

from unbroken.procwait import ExitWaiter
from unbroken.protocol import done_key, error_key


def worker_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--uid", type=int, required=True)
    ap.add_argument("--members", required=True, help="comma-separated uids")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--numel", type=int, default=1024)
    ap.add_argument("--pace", type=float, default=0.005, help="simulated compute per step (s)")
    ap.add_argument("--max-steps", type=int, default=100_000)
    ap.add_argument("--heartbeat", type=float, default=0.1)
    ap.add_argument("--staleness", type=float, default=1.0)
    ap.add_argument("--pg-timeout", type=float, default=30.0)
    ap.add_argument("--init-timeout", type=float, default=5.0)
    ap.add_argument("--die-in-reform", action="store_true",
                    help="SIGKILL itself in the first re-form, after the rendezvous and before "
                         "the process group (its peers' connect must time out and re-form)")
    a = ap.parse_args(argv)

    import torch

    from unbroken.runtime.ftcomm import FTComm

    torch.set_num_threads(1)
    members = [int(x) for x in a.members.split(",")]
    comm = None
    code = 0
    try:
        comm = FTComm(a.uid, members, host=a.host, port=a.port, heartbeat_period=a.heartbeat,
                      staleness=a.staleness, pg_timeout=a.pg_timeout,
                      init_timeout=a.init_timeout)
        if a.die_in_reform:
            comm.on_rendezvous = lambda: os.kill(os.getpid(), signal.SIGKILL)
        st = comm.store
        step = 0
        seen_gen = 0
        stop_at = a.max_steps
        while step < stop_at:
            if stop_at == a.max_steps and st.add("stop", 0) > 0:
                # agree on a common last step so nobody leaves a peer inside a collective
                stop_at = int(st.compare_set("stop_at", "", str(step + 3)))
                if step >= stop_at:
                    break
            t = torch.full((a.numel,), float(a.uid + 1))
            if not comm.allreduce(t):
                comm.reform()
                step = _settle(comm, step)
                continue  # retry the same step in the new generation
            res = {"gen": comm.generation, "members": comm.members, "value": float(t[0]),
                   "uniform": bool((t == t[0]).all()), "t": time.time()}
            blob = json.dumps(res)
            st.set(f"result/{a.uid}/{step}", blob)
            if comm.generation != seen_gen:
                seen_gen = comm.generation
                st.set(f"first/{a.uid}/{seen_gen}", blob)
            step += 1
            if a.pace > 0:
                time.sleep(a.pace)  # stands in for the compute of a training step
        finish(comm, a.uid, {"steps": step, "journal": comm.journal,
                             "graveyard": len(comm.graveyard)})
    except BaseException:
        code = report_error(comm, a.uid)
    hard_exit(code)


def _settle(comm, step: int) -> int:
    """After a re-form: a member whose op completed while a peer's failed (a ring all-reduce
    ends at different times on each rank) is one step ahead; the member behind takes that
    step's result from the peer (rolled forward), so every member retries the same step and
    the members agree on a common last step when told to stop. Loops on new failures."""
    import torch

    while True:
        v = torch.zeros(len(comm.members), dtype=torch.float64)
        v[comm.rank] = float(step)
        if comm.allreduce(v):
            break
        comm.reform()
    ahead = [u for u, s in zip(comm.members, v.tolist()) if s > step]
    if ahead:
        st = comm.store
        st.set(f"result/{comm.uid}/{step}", st.get(f"result/{ahead[0]}/{step}"))
        step += 1
    return step


def finish(comm, uid: int, payload: dict) -> None:
    """Post ``done/<uid>``, then leave only when every member has finished its last
    all-reduce: a peer that exits early would break a slower peer's final op and cost it a
    needless reform."""
    try:
        comm.store.set(done_key(uid), json.dumps(payload))
        comm.store.wait([done_key(m) for m in comm.members], timedelta(seconds=10))
    except Exception:
        pass  # a member died after the last step, or the coordinator is gone: nothing to protect


def report_error(comm, uid: int) -> int:
    """Record the traceback in the store (``error/<uid>``) and on stderr; exit code 3."""
    traceback.print_exc()
    try:
        if comm is not None:
            comm.store.set(error_key(uid), traceback.format_exc())
    except Exception:
        pass  # no coordinator to tell: stderr has it
    return 3


def hard_exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # never wait on gloo threads of abandoned groups


class LocalCluster:
    """Coordinator for ``n`` local workers: hosts the store, starts, signals and reaps them.

    Workers are forked from a server that imported torch once (:mod:`unbroken.spawn`): a start
    costs a fork, not a ~2 s import, and each ``procs[uid]`` has the ``Popen`` surface."""

    ENTRY = "unbroken.runtime.ftcomm_worker:worker_main"

    def __init__(self, n: int = 4, *, numel: int = 1024, pace: float = 0.005,
                 heartbeat: float = 0.1, staleness: float = 1.0,
                 pg_timeout: float = 30.0, init_timeout: float = 5.0,
                 die_in_reform: tuple[int, ...] = ()) -> None:
        from unbroken.runtime.store_host import serve_store

        self.uids = list(range(n))
        self.store = serve_store()
        self.port = self.store.port
        self._init_procs()
        members = ",".join(map(str, self.uids))
        for u in self.uids:
            self._start(u, self.ENTRY, [
                "--uid", str(u), "--members", members, "--port", str(self.port),
                "--numel", str(numel), "--pace", str(pace), "--heartbeat", str(heartbeat),
                "--staleness", str(staleness), "--pg-timeout", str(pg_timeout),
                "--init-timeout", str(init_timeout),
                *(["--die-in-reform"] if u in die_in_reform else [])])

    def _init_procs(self) -> None:
        self.procs: dict[int, Any] = {}
        self._exits = ExitWaiter()
        # stderr of each worker: a file, not a pipe, so a chatty worker never blocks
        self._errdir = tempfile.mkdtemp(prefix="unbroken-stderr-")

    def _start(self, uid: int, entry: str, argv: list[str]) -> None:
        from unbroken import spawn

        self.procs[uid] = spawn.start(entry, argv, stderr_path=self._errpath(uid),
                                      env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})

    def _errpath(self, uid: int) -> str:
        return os.path.join(self._errdir, f"stderr-{uid}")

    # -- waiting (on store keys and process exits only)
    def _stacks(self, uids: list[int]) -> str:
        """The live workers' stacks (py-spy, non-blocking), for a wait that timed out: where a
        worker sits is the one thing its journal cannot say."""
        from unbroken.detect.stacks import dump_stacks

        out = []
        for u in uids:
            if self.procs[u].poll() is None:
                d = dump_stacks(self.procs[u].pid, timeout=5.0)
                out.append(f"--- worker {u} ({d.method}):\n{d.text}")
        return ("\n" + "\n".join(out)) if out else ""

    def wait_key(self, key: str, timeout: float, alive: list[int] | None = None) -> Any:
        """Wait for ``key``; fail fast if an expected-alive worker exited or reported an error."""
        deadline = time.monotonic() + timeout
        watch = self.uids if alive is None else alive
        while True:
            if self.store.check([key]):
                return json.loads(self.store.get(key))
            for u in watch:  # a worker posts ``error`` just before it exits
                if self.procs[u].poll() is None:
                    continue
                if self.store.check([error_key(u)]):
                    raise AssertionError(f"worker {u} failed:\n{self.store.get(error_key(u)).decode()}")
                if not self.store.check([done_key(u)]) and not self.store.check([key]):
                    # (it may have posted, then left)
                    raise AssertionError(f"worker {u} exited rc={self.procs[u].returncode}:\n"
                                         f"{self.stderr(u)[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {key!r} within {timeout}s" + self._stacks(watch))
            # pause until a watched worker exits or 10 ms pass: the launcher shares the cores
            # with the workers, so its waiting must cost them nothing
            self._exits.wait([self.procs[u] for u in watch], 0.01)

    def stderr(self, uid: int) -> str:
        try:
            with open(self._errpath(uid), "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def result(self, uid: int, step: int) -> dict:
        return json.loads(self.store.get(f"result/{uid}/{step}"))

    # -- faults
    def kill(self, uid: int, *, notify: bool = False) -> float:
        """SIGKILL ``uid``; with ``notify`` wait for its exit and post a death notice."""
        t = time.time()
        self.procs[uid].send_signal(signal.SIGKILL)
        if notify:
            from unbroken.runtime.ftcomm import declare_dead

            self.procs[uid].wait(timeout=10)
            declare_dead(self.store, uid)
        return t

    def hang(self, uid: int) -> float:
        t = time.time()
        self.procs[uid].send_signal(signal.SIGSTOP)
        return t

    # -- shutdown
    def stop(self, survivors: list[int], timeout: float = 30.0) -> dict[int, dict]:
        self.store.add("stop", 1)
        out = {u: self.wait_key(done_key(u), timeout, alive=survivors) for u in survivors}
        for u in survivors:
            self.procs[u].wait(timeout=timeout)
        return out

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()  # works on SIGSTOPped processes too
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        shutil.rmtree(self._errdir, ignore_errors=True)
        self._exits.close()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    worker_main()
