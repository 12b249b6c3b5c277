"""Tail a kernel log for XID lines: new lines each poll, never an exception.

Why a tail and not a re-scan: the detector polls every round (seconds; ByteRobust reports GPU
loss detected in ~10 s with inspection against ~10 min for an NCCL timeout, byterobust.md §3),
and the kernel log only grows — so it remembers its byte offset and reads what was appended.
A line still being written (no newline yet) waits for the next poll rather than being parsed
torn.

Why it never raises: a detector that crashes on a garbled log line, a rotated file or a missing
``/var/log/kern.log`` would take the guard down — or worse, training with it. So every problem
comes back as data: malformed XID lines beside the events (``core.xid.scan`` already keeps them
apart), and a short ``problems`` list (missing file, permission, truncation, rotation). A
problem that persists is reported once, when it starts, not on every poll.

Rotation and truncation: when the file is shorter than the offset (truncated), has another
inode (rotated, a new file under the same name), or its first bytes changed (rewritten in
place), the tail starts over from the beginning of the new content. Lines of the old file that
were not yet read are lost — the kernel ring buffer (``dmesg``) is the backstop.

``DmesgSource`` does the same from the ``dmesg`` command (where the kernel lets us read it:
``kernel.dmesg_restrict`` often forbids it to non-root users), remembering the last line it
returned; without permission or without the command it reports once and returns nothing.

The action class of each XID comes from ``core.xid.action_for`` (backendai.md §3 Table 3).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from typing import NamedTuple

from unbroken.core.xid import MalformedLine, XidEvent, action_for, scan

__all__ = ["XidHit", "XidRead", "XidSource", "DmesgSource"]

#: Bytes read per poll at most (a huge backlog is read over several polls).
MAX_READ = 4 << 20
#: A "line" longer than this without a newline is taken as a line (a runaway writer).
MAX_LINE = 64 << 10
#: Bytes of the file's head remembered to tell a rewritten file from a grown one.
HEAD = 256


class XidHit(NamedTuple):
    event: XidEvent
    action: str    # core.xid action class: restart_app, reset_gpu, reboot_node, investigate...
    reason: str    # action_for's reason (the log line)


class XidRead(NamedTuple):
    hits: list[XidHit]
    malformed: list[MalformedLine]   # lineno counts lines of the current file (1-based)
    problems: list[str]              # one-line reports: missing file, rotation, errors


def _hits(events: Sequence[XidEvent]) -> list[XidHit]:
    out = []
    for ev in events:
        action, reason = action_for(ev.code)
        out.append(XidHit(ev, action, reason))
    return out


class XidSource:
    """Incremental reader of a kernel-log file (``dmesg`` output, ``kern.log``, syslog)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.offset = 0          # bytes of the current file consumed (complete lines)
        self.lines = 0           # complete lines consumed from the current file
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the current file
        self._head = b""         # its first bytes, as last seen
        self._pending = b""      # a trailing line without its newline yet
        self._last_problem: str | None = None

    def _report(self, problems: list[str], key: str, msg: str) -> None:
        if self._last_problem != key:
            problems.append(msg)
        self._last_problem = key

    def _restart(self) -> None:
        self.offset = 0
        self.lines = 0
        self._pending = b""
        self._head = b""

    def poll(self) -> XidRead:
        """The XID lines appended since the last poll. Never raises."""
        problems: list[str] = []
        try:
            return self._poll(problems)
        except Exception as e:  # noqa: BLE001 - a detector must not take training down
            self._report(problems, f"error:{type(e).__name__}",
                         f"xid source {self.path!r}: {type(e).__name__}: {e}")
            return XidRead([], [], problems)

    def _poll(self, problems: list[str]) -> XidRead:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            if self._ident is not None:
                self._ident = None
                self._restart()
            self._report(problems, "missing", f"xid source {self.path!r}: file missing")
            return XidRead([], [], problems)
        except OSError as e:
            self._report(problems, f"open:{e.errno}",
                         f"xid source {self.path!r}: cannot open ({e.strerror or e})")
            return XidRead([], [], problems)
        with f:
            st = os.fstat(f.fileno())
            ident = (st.st_dev, st.st_ino)
            self._last_problem = None  # readable again: report the next outage again
            if self._ident is not None and ident != self._ident:
                problems.append(f"xid source {self.path!r}: file replaced (rotated); "
                                f"reading the new file from the start")
                self._restart()
            elif st.st_size < self.offset + len(self._pending):
                problems.append(f"xid source {self.path!r}: truncated to {st.st_size} bytes "
                                f"(was {self.offset + len(self._pending)}); reading from the "
                                f"start")
                self._restart()
            elif self._head:
                head = f.read(len(self._head))
                if head != self._head:
                    problems.append(f"xid source {self.path!r}: rewritten in place; reading "
                                    f"from the start")
                    self._restart()
            self._ident = ident
            start = self.offset + len(self._pending)
            f.seek(start)
            data = f.read(MAX_READ)
            if len(self._head) < HEAD:
                f.seek(0)
                self._head = f.read(HEAD)
        buf = self._pending + data
        cut = buf.rfind(b"\n") + 1
        complete, rest = buf[:cut], buf[cut:]
        if len(rest) > MAX_LINE:
            complete, rest = buf, b""
        self._pending = rest
        self.offset += len(complete)
        lines = complete.splitlines()
        found = scan(lines)
        base = self.lines
        self.lines += len(lines)
        malformed = [MalformedLine(m.lineno + base, m.line, m.error) for m in found.malformed]
        return XidRead(_hits(found.events), malformed, problems)


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[bytes]"]


def _run_dmesg(cmd: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(cmd), capture_output=True, timeout=5.0, check=False)


class DmesgSource:
    """XID lines from ``dmesg``, new ones each poll; degrades to reports when not permitted.

    The kernel ring buffer is returned whole on each call, so the source remembers the last
    line it has seen and returns the lines after it; if that line has left the ring (it
    wrapped), every line is new. ``run`` is injectable for tests.
    """

    def __init__(self, cmd: Sequence[str] = ("dmesg",), run: Runner | None = None) -> None:
        self.cmd = tuple(cmd)
        self._run = run or _run_dmesg
        self._last: bytes | None = None
        self._last_problem: str | None = None

    def poll(self) -> XidRead:
        """The XID lines logged since the last poll. Never raises."""
        problems: list[str] = []
        try:
            res = self._run(self.cmd)
            if res.returncode != 0:
                err = (res.stderr or b"").decode("utf-8", "replace").strip().splitlines()
                msg = err[0] if err else f"exit status {res.returncode}"
                return self._fail(problems, f"rc:{res.returncode}",
                                  f"{' '.join(self.cmd)}: {msg}")
            lines = (res.stdout or b"").splitlines()
        except FileNotFoundError:
            return self._fail(problems, "nocmd", f"{self.cmd[0]}: command not found")
        except subprocess.TimeoutExpired:
            return self._fail(problems, "timeout", f"{' '.join(self.cmd)}: timed out")
        except Exception as e:  # noqa: BLE001 - a detector must not take training down
            return self._fail(problems, f"error:{type(e).__name__}",
                              f"{' '.join(self.cmd)}: {type(e).__name__}: {e}")
        self._last_problem = None
        new = lines
        if self._last is not None:
            for i in range(len(lines) - 1, -1, -1):
                if lines[i] == self._last:
                    new = lines[i + 1:]
                    break
        if lines:
            self._last = lines[-1]
        found = scan(new)
        return XidRead(_hits(found.events), list(found.malformed), problems)

    def _fail(self, problems: list[str], key: str, msg: str) -> XidRead:
        if self._last_problem != key:
            problems.append(msg)
        self._last_problem = key
        return XidRead([], [], problems)
