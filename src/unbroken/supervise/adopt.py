"""A standby supervisor adopts the running members of a job whose supervisor died.

Why a file of its own: everything else in ``supervise`` starts the processes it watches; here
they were started by a supervisor that is gone, live on (their own state in memory) and
re-attach to this one's store (``runtime.reattach``). What they report is the standby's whole
view of the job; ``core.coordination.adoption`` decides on it.

* :class:`AdoptedProc` -- the ``Popen`` surface the attempt loop needs, for a process this
  one did not start: its exit is seen through a pidfd (readable when it ends, no ``waitpid``
  possible), its exit code read from ``exit/<uid>`` (written by the worker just before it
  exits; absent: it was killed).
* :func:`collect` -- wait for the reports of the newest generation's members (a member that
  never comes is adopted as lost, and replaced like a dead one), then hand each a handle.

Latency budget: the reports come within a heartbeat period or two of the store's
publication in etcd (the members poll it every 50 ms); the wait for a missing member is
``timeout`` (the supervisor's ``adopt_timeout``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from unbroken.core.coordination import Adoption, adoption
from unbroken.procwait import close_quietly, readable
from unbroken.protocol import exit_key, reattach_key

__all__ = ["AdoptedProc", "collect", "history", "journal_sizes", "known_uids", "stop_paused"]


class AdoptedProc:
    """A running worker this supervisor did not start (``pid``; ``None``: it never came)."""

    def __init__(self, pid: int | None, uid: int, store, rank: int = 0) -> None:
        self.pid, self.uid, self.store, self.rank = pid or 0, uid, store, rank
        self.returncode: int | None = None
        self.sentinel = None
        if pid:
            try:
                self.sentinel = os.pidfd_open(pid)  # readable once it has exited
            except (ProcessLookupError, OSError):
                pass
        if self.sentinel is None:  # gone before it could be adopted
            self.returncode = -signal.SIGKILL
            self.sentinel = os.open(os.devnull, os.O_RDONLY)  # always readable

    def __del__(self) -> None:
        close_quietly(getattr(self, "sentinel", None))

    def poll(self) -> int | None:
        if self.returncode is None:
            if not readable([self.sentinel], 0):
                return None
            key = exit_key(self.uid, self.rank)
            try:
                self.returncode = int(self.store.get(key)) if self.store.check([key]) \
                    else -signal.SIGKILL
            except Exception:  # the store is closing: it did not say
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        if self.poll() is None:
            if not readable([self.sentinel], timeout):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.poll()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self.pid:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def journal_sizes(merged: Path, jdir: Path) -> dict[Path, int]:
    """Where each journal ends now: :func:`history` reads up to there (taken while the
    members are paused, read once they train on: the go does not wait for the reading)."""
    return {p: p.stat().st_size for p in [merged, *jdir.glob("group-*.jsonl")] if p.exists()}


def history(merged: Path, jdir: Path, upto: dict[Path, int]) -> list[dict]:
    """The job's events from before this standby, in time order, so that its report covers
    the whole job: the earlier supervisors' own events (``src`` ``driver`` in the merged
    journal) and every group journal as the members left it (each read up to ``upto``, see
    :func:`journal_sizes`). Damaged lines -- a supervisor killed mid-write -- are skipped."""
    def lines(path: Path):
        try:
            with open(path, "rb") as f:
                data = f.read(upto.get(path, 0)).decode(errors="replace")
        except FileNotFoundError:
            return
        for line in data.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and isinstance(ev.get("t"), (int, float)):
                yield ev
    evs = [e for e in lines(merged) if e.get("src") == "driver"]
    for f in sorted(jdir.glob("group-*.jsonl")):
        evs += [{**e, "src": f.stem} for e in lines(f)]
    return sorted(evs, key=lambda e: e["t"])


def known_uids(jdir: Path) -> set[int]:
    """Every uid that ever journaled in this job (members and spares)."""
    return {int(f.stem.split("-")[1]) for f in jdir.glob("group-*.jsonl")}


def collect(store, uids: set[int], timeout: float, ranks: int = 1
            ) -> tuple[Adoption | None, str, dict]:
    """Wait up to ``timeout`` s for the re-attach reports of the newest generation's members
    among ``uids``; returns the decision, its reason and the reports (uid -> rank 0's report,
    with ``pids``: every rank's, rank order). A group of ``ranks`` ranks has reported once all
    of them have: a rank cannot train without its siblings."""
    reports: dict[int, dict] = {}
    partial: dict[int, dict[int, dict]] = {}
    deadline = time.monotonic() + timeout
    while True:
        for u in sorted(uids - set(reports)):
            got = partial.setdefault(u, {})
            for k in range(ranks):
                if k not in got and store.check([reattach_key(u, k)]):
                    got[k] = json.loads(store.get(reattach_key(u, k)))
            if len(got) == ranks:
                reports[u] = {**got[0], "pids": [int(got[k]["pid"]) for k in range(ranks)],
                              "steps": [int(got[k]["step"]) for k in range(ranks)]}
                uids |= {int(m) for m in reports[u]["members"]}
        final = time.monotonic() >= deadline
        got, why = adoption(reports, final)
        if got is not None or final:
            # ranks of a group that did not all come: paused, never to train (the group is
            # adopted as lost, or nothing is): they go, as the group's fence would
            for u, rs in partial.items():
                if u not in reports:
                    for r in rs.values():
                        _kill(int(r["pid"]))
            return got, why, reports
        time.sleep(0.02)  # a poll of store keys (the reports come in 10s of ms)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_paused(reports: dict[int, dict]) -> None:
    """Nothing adopted: the members paused at a boundary (every rank) go; the restart from
    the checkpoint replaces them."""
    for r in reports.values():
        for pid in r.get("pids", [r["pid"]]):
            _kill(int(pid))
