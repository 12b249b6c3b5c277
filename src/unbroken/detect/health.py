"""The per-group health agent: what a group sees of itself, reported once a second.

Why an agent in the group: the coordinator sees commits and heartbeats, which say that a group
is alive and when a step finished, but not *how* the group is doing — a process whose memory
keeps growing, whose CPU is starved by a neighbour, whose threads multiply, or that falls behind
its peers in steps. The Backend.AI report (backendai.md §2) finds faults early by comparing such
signals across peers; ByteRobust's agents (byterobust.md §3) watch the machine next to the job.
So a daemon thread in every worker samples its own process (``/proc/self``, ``os.times``) and
the runner's progress and journals one ``health`` line per period; the guard compares the
groups with ``core.anomaly.peer_outliers`` (log-only: an alert, never an action).

Cost: one ``/proc`` read and one journal line per second per group, off the training thread.
A failing probe is reported once in the line (``error``) and never raises into training.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from unbroken.events import Event

__all__ = ["HealthAgent", "sample_process"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def sample_process() -> dict:
    """This process: resident memory (MiB), CPU seconds (user + system), threads."""
    t = os.times()
    out = {"cpu_s": t.user + t.system, "threads": threading.active_count()}
    try:
        with open("/proc/self/statm") as f:
            out["rss_mb"] = int(f.read().split()[1]) * _PAGE / 2**20
    except OSError:
        pass  # not Linux: no RSS, the other signals still compare
    return out


class HealthAgent:
    """Samples every ``period`` s and hands ``{"event": Event.HEALTH, ...}`` to ``report``.

    ``progress()`` returns what the runner knows (``step``, last ``compute_s``); the agent adds
    the step rate and the CPU utilisation over the last period (CPU seconds per wall second:
    a straggler sleeping in I/O or starved of CPU shows up low, a busy-looping one high).
    """

    def __init__(self, uid: int, report: Callable[[dict], None],
                 progress: Callable[[], dict], period: float = 1.0) -> None:
        self.uid, self.report, self.progress, self.period = uid, report, progress, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"health-{uid}", daemon=True)
        self._last: tuple[float, float, int] | None = None
        self._error: str | None = None

    def start(self) -> HealthAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sample(self, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        ev: dict = {"event": Event.HEALTH, "uid": self.uid, "t": now}
        try:
            proc = sample_process()
            prog = self.progress()
            ev.update(proc)
            ev.update(prog)
            step = int(prog.get("step", 0))
            if self._last is not None:
                t0, cpu0, step0 = self._last
                dt = max(1e-6, now - t0)
                ev["cpu_util"] = round((proc["cpu_s"] - cpu0) / dt, 4)
                ev["step_rate"] = round((step - step0) / dt, 4)
            self._last = (now, proc["cpu_s"], step)
        except Exception as exc:  # a broken probe must not disturb training
            if self._error is None:
                self._error = f"health probe failed: {exc!r}"[:200]
                ev["error"] = self._error
        return ev

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.report(self.sample())
            except Exception:
                return  # the journal is gone: the process is ending
