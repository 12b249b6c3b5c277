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

Cost per step (``bench/stragglers.py`` measures it): two ``thread_time`` calls (~1 us each)
and one ``pread`` of the already open ``/proc/self/io`` plus its parse (~5 us).
"""

from __future__ import annotations

import os

__all__ = ["IoCounter", "ring_rx_bytes"]


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
