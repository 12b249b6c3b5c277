"""The R processes of one data-parallel group, seen as one process.

Why one handle for R processes: a group is the unit SPARe masks, the guard evicts and a spare
replaces, so every part of the launcher and the supervisor that tracks "the group's process"
(death notices, the hung-member kill, the exit waiter, XID holders) keeps working unchanged
when a group has several ranks. The contract that makes it a group:

* **One failure fences the group.** The first rank seen to exit with a non-zero status (or a
  signal) makes :meth:`poll` SIGKILL every other rank at once: a rank left running would block
  its group's collectives (FSDP's all-gathers) and hold its plane's place in the next
  generation. The group's status is that first failure's, whatever the fenced ranks report
  after it; among failures found together, a rank killed by a signal (the fault) before one
  that exited on its own (a rank that noticed it), then the lowest rank.
* **The survivors hear of it before the fence ends.** ``on_lost`` (the launcher's death notice)
  is called as soon as the group's status says it is lost, before the other ranks are killed
  and reaped: tearing down a torch process took ~10 ms here, and the survivors' re-form waited
  for the notice (R = 2 kill -> commit, ``bench/rank_groups.py``). A rank killed after the
  notice cannot step with the survivors: they re-form without its group, and its own ranks'
  collectives need the rank that died.
* **Done means every rank done.** Status 0 once every rank exited 0; None while any runs.
* ``kill`` / ``send_signal`` go to every rank (a SIGSTOPped rank is killed too).

``pid`` is rank 0's (the group's journal writer); ``pids`` all of them; ``sentinels`` lets
:class:`unbroken.procwait.ExitWaiter` wake on any rank's exit.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from unbroken.core.ranks import group_status, lost_status

__all__ = ["RankGroup", "fence_reason"]


def fence_reason(journal_dir: str | Path, uid: int) -> dict | None:
    """Why a rank other than 0 of group ``uid`` fenced its group (exit 11): the
    ``group_fenced`` line it wrote before it left, in its own journal
    (``rank-<uid>.<rank>.jsonl``, which the launcher does not tail; rank 0's is the group's).
    None when no such rank wrote one (a journal on another node's disk, or a rank killed
    before it could)."""
    for path in sorted(Path(journal_dir).glob(f"rank-{uid}.*.jsonl")):
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 8192))  # the line is among the last it wrote
            tail = f.read().decode(errors="replace").splitlines()
        for line in reversed(tail):
            try:
                ev = json.loads(line)
            except ValueError:  # the cut first line of the tail
                continue
            if isinstance(ev, dict) and ev.get("event") == "group_fenced":
                return ev
    return None


class RankGroup:
    """``procs``: the group's rank processes, rank order (each with the ``Popen`` surface);
    ``on_lost()``: called once, before the fence, when the group's status is its loss."""

    def __init__(self, procs: Sequence[Any], on_lost: Callable[[], None] | None = None) -> None:
        if not procs:
            raise ValueError("a group needs at least one rank")
        self.procs = list(procs)
        self.on_lost = on_lost
        self.returncode: int | None = None
        self.fenced_at: float | None = None  # wall time the other ranks were killed
        self.failed_rank: int | None = None

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    @property
    def sentinels(self) -> list[int]:
        return [p.sentinel for p in self.procs if hasattr(p, "sentinel")]

    @property
    def args(self) -> list[str]:
        return list(getattr(self.procs[0], "args", []))

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        status = group_status([p.poll() for p in self.procs])
        if status is not None and status[1] != 0:
            self.failed_rank = status[0]
            if self.on_lost is not None and lost_status(status[1]):
                try:
                    self.on_lost()
                except Exception:  # no store: the launcher's own notice, or the heartbeats
                    pass
            self._fence()
        if status is not None:
            self.returncode = status[1]
        return self.returncode

    def _fence(self) -> None:
        self.fenced_at = time.time()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(timeout=10)

    def wait(self, timeout: float | None = None) -> int:
        """The group's status once it has one; ``subprocess.TimeoutExpired`` after
        ``timeout`` s (as ``Popen.wait``)."""
        from unbroken.procwait import ExitWaiter

        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = ExitWaiter()
        try:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                waiter.wait([p for p in self.procs if p.poll() is None],
                            0.5 if left is None else min(0.5, left))
        finally:
            waiter.close()
        return self.returncode

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)
