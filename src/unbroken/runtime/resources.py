"""A group's resource signals, sampled once per step (STAR predicts stragglers from available CPU
and bandwidth, ../shared/reference/star.md section 3). What each number is, honestly:

* **CPU availability** (``cpu`` in the commit event): the main thread's CPU time
  (``time.thread_time``, CLOCK_THREAD_CPUTIME_ID) over the wall time of the group's own part of
  the step (computing its gradients, before it enters the collective). The worker computes on
  that one thread (``torch.set_num_threads(1)``), so 1.0 means it had a core to itself; 0.5 that
  something else (a co-located process, the other groups on too few cores) held the core half
  the time. An injected straggler factor F sleeps inside that part, so it reads as ~1/F: the
  trace looks like what it models, a machine that gives the group 1/F of a core. Not the
  system's ``/proc/loadavg`` (a one-minute average over every process, too slow for a step).
* **bytes sent** (``tx_bytes``): the growth of ``wchar`` in ``/proc/self/io`` since the previous
  commit, for the whole process (every thread). gloo writes its TCP pairs with ``writev``, which
  Linux counts there (measured: an 8 MB all-reduce of two ranks adds 8,001,152 bytes), so this
  is the collectives' real traffic, plus the journal lines and checkpoint files the process
  writes (~0.5 kB a step; a checkpoint's size at its step). The store client's ``send()`` is
  not counted (a few hundred bytes a step).
* **bytes received** (``rx_bytes``): *not measured*. gloo reads with ``recv()``, which
  ``rchar`` does not count, and ``/proc/self/net/dev`` is per network namespace (every group's
  loopback traffic together, not this group's). It is the ring all-reduce's model of the
  committed op: ``2 (m - 1) / m`` x the buffer's bytes for ``m`` members (what each member
  receives in reduce-scatter plus all-gather); a retried op is not counted.
* **run-queue wait** (:func:`runqueue_wait`, the sync modes' predictor only): how long the
  calling thread was runnable but not running, from ``/proc/thread-self/schedstat`` (the
  scheduler's own count, ns). With the thread's CPU time it splits a wall time exactly: CPU +
  run-queue wait + *blocked* (asleep: a slow device's or the network's wait, an injected
  straggler's sleep). Measured with three processes on this machine's 2 cores, each computing
  150 ms and sleeping 50: wall 0.22-0.28 s, wait 0.02-0.09 s, blocked 0.049-0.053 s -- the
  scheduler's noise is all in the wait, none in the blocked part.

Cost per step (``bench/stragglers.py`` measures it): two ``thread_time`` calls (~1 us each)
and one ``pread`` of the already open ``/proc/self/io`` plus its parse (~5 us); under a sync
mode other than ``sync``, two :func:`runqueue_wait` calls per computing phase (~5 us each: an
open, a read and a close, since the file is the calling thread's).
"""

from __future__ import annotations

import os

__all__ = ["IoCounter", "ring_rx_bytes", "runqueue_wait"]

_SCHEDSTAT = "/proc/thread-self/schedstat"
_has_schedstat = os.path.exists(_SCHEDSTAT)


def runqueue_wait() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a CPU (the second field
    of ``/proc/thread-self/schedstat``); None where that cannot be read (not Linux, a kernel
    without schedstats)."""
    if not _has_schedstat:
        return None
    try:
        fd = os.open(_SCHEDSTAT, os.O_RDONLY)
        try:
            return int(os.read(fd, 128).split()[1]) * 1e-9
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return None


class IoCounter:
    """``/proc/self/io``'s ``wchar`` through one file descriptor opened once (a ``pread`` per
    sample, no open/close on the step's path). ``sent()`` is None where the file cannot be
    read (not Linux, a hardened /proc)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            self.fd = os.open("/proc/self/io", os.O_RDONLY)
            self._read()
        except (OSError, ValueError, IndexError):
            self.close()

    def _read(self) -> int:
        data = os.pread(self.fd, 512, 0)
        i = data.index(b"wchar:")
        return int(data[i + 6:data.index(b"\n", i)])

    def sent(self) -> int | None:
        if self.fd is None:
            return None
        try:
            return self._read()
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        fd, self.fd = getattr(self, "fd", None), None
        if fd is not None:
            try:
                os.close(fd)
            except (OSError, TypeError):  # at interpreter exit ``os`` may be gone already
                pass

    __del__ = close  # in-process tests build many runners


def ring_rx_bytes(buffer_bytes: int, members: int) -> int:
    """What each of ``members`` receives in a ring all-reduce of ``buffer_bytes``."""
    return 0 if members < 2 else int(2 * (members - 1) * buffer_bytes / members)
