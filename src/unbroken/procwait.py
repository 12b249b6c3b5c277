"""Sleep until one of several child processes exits, or a timeout passes, without polling.

Why: the supervisor (and the test cluster) must hear of a death within milliseconds, and
between deaths it should cost nothing. ``Popen.wait(timeout)`` polls (it sleeps 0.5 ms,
doubling to 50 ms, and calls ``waitpid`` in between), so a loop that waited 20 ms on one
member burnt a fifth of a core of the supervisor on this 2-core box: CPU the training
processes, which share the cores, did not get. A pidfd (Linux >= 5.3) becomes readable when
its process exits, so one ``poll`` of the members' pidfds sleeps in the kernel until a death
or the timeout. Where pidfds are missing, the fallback is ``Popen.wait`` on one process.
Workers started by :mod:`unbroken.spawn` carry their own ``sentinel`` (readable at their end),
which is waited on the same way.

Every wait on file descriptors goes through :func:`readable` (``poll``), never ``select``:
``select`` takes no descriptor numbered 1024 or more (``FD_SETSIZE``), and a long-lived
supervisor of many groups (a sentinel, a channel and store sockets each) or a test process
that ran many jobs gets there: the wait then raised ``ValueError`` instead of waiting.
"""

from __future__ import annotations

import math
import os
import select
import subprocess
from typing import Any, Iterable, Sequence

__all__ = ["ExitWaiter", "close_quietly", "readable"]

_ANY = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


def readable(fds: Sequence[Any], timeout: float | None) -> list[Any]:
    """Those of ``fds`` (descriptors, or objects with ``fileno()``) that are readable (data,
    end of file, an exited pidfd, an error) within ``timeout`` seconds (None: until one is),
    as ``select``'s first list."""
    p, of = select.poll(), {}
    for f in fds:
        of[f if isinstance(f, int) else f.fileno()] = f
        p.register(f, _ANY)
    ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
    return [of[fd] for fd, _ev in p.poll(ms)]


def close_quietly(*fds: int | None) -> None:
    """Close the descriptors given (None and already-closed ones are skipped): what an object
    owning a sentinel does when it is collected: a bare ``int`` from ``os.pipe`` or
    ``pidfd_open`` is not closed by the garbage collector, and a process that starts many
    jobs (a test process) would keep every one."""
    for fd in fds:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


class ExitWaiter:
    """Keeps one pidfd per live child; :meth:`wait` returns at the first exit or timeout."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid -> pidfd (only for children not yet reaped)
        self._pidfd = hasattr(os, "pidfd_open")

    def wait(self, procs: Iterable[subprocess.Popen], timeout: float) -> None:
        """Return when one of ``procs`` has exited (at once if one already has, unreaped or
        not yet looked at) or after ``timeout`` seconds. Nothing is reaped that the caller
        would miss: ``Popen.poll`` keeps the exit code."""
        live: list[subprocess.Popen] = []
        for p in procs:
            if p.returncode is not None:
                continue
            if p.poll() is not None:
                self._close(p.pid)
                return  # exited already: the caller's own poll sees it
            live.append(p)
        running = {p.pid for p in live}
        for pid in [pid for pid in self._fds if pid not in running]:
            self._close(pid)
        if not live:
            readable([], timeout)
            return
        # unbroken.spawn workers carry a sentinel; a group of ranks (supervise.rankgroup) one
        # per rank
        own = [fd for p in live for fd in getattr(p, "sentinels", None) or
               ([p.sentinel] if hasattr(p, "sentinel") else [])]
        popen = [p for p in live if not hasattr(p, "sentinel") and not hasattr(p, "sentinels")]
        fds = list(own)
        if popen and self._pidfd:
            try:
                # not reaped (poll above said running, and only this process reaps its
                # children), so the pid cannot have been reused
                fds += [self._fds.get(p.pid) or self._open(p.pid) for p in popen]
            except OSError:  # no pidfd support in this kernel: poll from now on
                self._pidfd = False
                self.close()
                fds = list(own)
        if popen and len(fds) == len(own):
            try:
                popen[0].wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            return
        readable(fds, timeout)

    def _open(self, pid: int) -> int:
        fd = os.pidfd_open(pid)
        self._fds[pid] = fd
        return fd

    def _close(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for pid in list(self._fds):
            self._close(pid)

    def __del__(self) -> None:
        close_quietly(*getattr(self, "_fds", {}).values())
