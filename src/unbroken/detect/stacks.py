"""Dump the Python stacks of live workers and localise a hang (byterobust.md §6).

Why two ways: py-spy reads another process's memory from outside (ptrace), so it works on a
worker that is wedged in C code holding the GIL and needs nothing from the worker; on the
project machine ``py-spy dump --pid`` takes ~15-40 ms (gloo-failures.md §6), and ``--native``
adds the C++ frames (``c10d::Work::wait``). Where ptrace is not allowed (containers without
``SYS_PTRACE``, ``kernel.yama.ptrace_scope`` >= 2), py-spy fails; the fallback is
``faulthandler``: a worker that called :func:`install_faulthandler` at start-up has a C-level
handler on ``SIGUSR1`` that writes every thread's stack to its own file, without needing the
interpreter to be responsive. :func:`read_faulthandler` sends the signal and reads what was
appended.

Both dump formats normalise to the same text in :func:`unbroken.core.stacks.normalise`, so a
rank dumped by the fallback does not look like an outlier. ``native=True`` adds C frames that
faulthandler cannot show: do not mix it with the fallback in one round.

A rank whose dump fails on every path gets the text ``<dump failed: ...>``: a worker that
cannot be inspected is its own cluster, hence an outlier.

Side effects only; the decision is :func:`unbroken.core.stacks.aggregate`.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path

from unbroken.core.stacks import Coord, StackVerdict, aggregate

__all__ = [
    "DumpError",
    "Dump",
    "Localisation",
    "pyspy_path",
    "dump_pyspy",
    "fault_file",
    "install_faulthandler",
    "read_faulthandler",
    "dump_stacks",
    "localise",
]

PYSPY = "py-spy"
FAULTHANDLER = "faulthandler"
FAILED = "failed"

_KEEP: list = []  # the open files faulthandler writes to, kept alive for the process


class DumpError(RuntimeError):
    """A stack dump that did not come back; the message names the pid and the cause."""


@dataclass(frozen=True)
class Dump:
    """One process's dump: how it was taken, the raw text, and how long it took."""

    pid: int
    method: str
    text: str
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class Localisation:
    verdict: StackVerdict
    reason: str
    dumps: dict


def pyspy_path() -> str | None:
    """The py-spy binary: the one beside this interpreter (the venv's), else on ``PATH``."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def _check_pid(pid: object) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise DumpError(f"pid={pid!r} is not a positive int")
    return pid


def dump_pyspy(pid: int, *, timeout: float = 5.0, native: bool = False) -> str:
    """``py-spy dump --pid`` of one process; raises :class:`DumpError` on any failure
    (no binary, no permission, no such process, timeout)."""
    _check_pid(pid)
    exe = pyspy_path()
    if exe is None:
        raise DumpError(f"pid {pid}: py-spy not installed (pip install '.[guard]')")
    # --nonblocking: a paused worker stops beating, and a dump round over a loaded machine
    # paused members long enough for their peers to leave them out of the next generation
    # (the suite's soak: false hangs right inside the stall vote's rounds); --native must pause
    cmd = [exe, "dump", "--pid", str(pid)] + (["--native"] if native else ["--nonblocking"])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DumpError(f"pid {pid}: py-spy dump timed out after {timeout} s") from None
    if p.returncode != 0 or not p.stdout.strip():
        err = " ".join((p.stderr or p.stdout).split())[:300]
        raise DumpError(f"pid {pid}: py-spy dump exit {p.returncode}: {err}")
    return p.stdout


def fault_file(directory: str | os.PathLike, pid: int) -> Path:
    """Where the worker with ``pid`` writes its faulthandler dumps."""
    return Path(directory) / f"faulthandler-{pid}.txt"


def install_faulthandler(
    directory: str | os.PathLike, sig: int = signal.SIGUSR1
) -> Path:
    """Call once at worker start-up: on ``sig`` the process appends all threads' stacks to
    ``fault_file(directory, os.getpid())``. Returns that path."""
    path = fault_file(directory, os.getpid())
    f = open(path, "a")
    _KEEP.append(f)
    faulthandler.register(sig, file=f, all_threads=True, chain=False)
    return path


def read_faulthandler(
    pid: int,
    directory: str | os.PathLike,
    *,
    sig: int = signal.SIGUSR1,
    timeout: float = 5.0,
    settle: float = 0.02,
) -> str:
    """Signal ``pid`` and return the dump it appends to its fault file.

    faulthandler writes the whole dump from its signal handler in one burst, so the dump is
    complete once the file has grown and then not grown for ``settle`` seconds. Raises
    :class:`DumpError` if the file is missing or nothing arrives within ``timeout``."""
    _check_pid(pid)
    path = fault_file(directory, pid)
    if not path.is_file():
        raise DumpError(f"pid {pid}: no faulthandler file {path} (install_faulthandler not called)")
    start = path.stat().st_size
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise DumpError(f"pid {pid}: no such process") from None
    except PermissionError:
        raise DumpError(f"pid {pid}: not allowed to signal") from None
    deadline = time.monotonic() + timeout
    size, changed = start, time.monotonic()
    while True:
        now = time.monotonic()
        cur = path.stat().st_size
        if cur != size:
            size, changed = cur, now
        elif size > start and now - changed >= settle:
            break
        if now > deadline:
            if size > start:
                break
            raise DumpError(f"pid {pid}: no faulthandler dump within {timeout} s")
        time.sleep(settle / 4)
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(size - start).decode("utf-8", "replace")


def dump_stacks(
    pid: int,
    *,
    use_pyspy: bool = True,
    fault_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
    native: bool = False,
) -> Dump:
    """One process's stacks: py-spy first (if ``use_pyspy``), then the faulthandler file in
    ``fault_dir`` (if given). Never raises for a failed dump: it returns a ``failed`` Dump
    whose text is ``<dump failed: ...>``."""
    _check_pid(pid)
    errors = []
    t0 = time.perf_counter()
    if use_pyspy:
        try:
            text = dump_pyspy(pid, timeout=timeout, native=native)
            return Dump(pid, PYSPY, text, time.perf_counter() - t0)
        except DumpError as e:
            errors.append(str(e))
    if fault_dir is not None:
        t0 = time.perf_counter()
        try:
            text = read_faulthandler(pid, fault_dir, timeout=timeout)
            return Dump(pid, FAULTHANDLER, text, time.perf_counter() - t0, "; ".join(errors))
        except DumpError as e:
            errors.append(str(e))
    if not errors:
        errors.append(f"pid {pid}: use_pyspy=False and no fault_dir")
    err = "; ".join(errors)
    return Dump(pid, FAILED, f"<dump failed: {err}>", time.perf_counter() - t0, err)


def localise(
    pids: Mapping[Hashable, int],
    coords: Mapping[Hashable, Coord],
    *,
    use_pyspy: bool = True,
    fault_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
    native: bool = False,
    dump: Callable[[Hashable], Dump] | None = None,
) -> Localisation:
    """Dump every rank's process (one at a time: each py-spy dump pauses its target
    briefly) and aggregate. ``pids`` and ``coords`` are keyed by rank; ``dump``: how to get
    one rank's Dump instead (a node agent dumps its own workers, ``NodeCluster``)."""
    dumps = {
        rank: dump(rank) if dump is not None else dump_stacks(
            pid, use_pyspy=use_pyspy, fault_dir=fault_dir, timeout=timeout, native=native
        )
        for rank, pid in pids.items()
    }
    verdict, reason = aggregate({r: d.text for r, d in dumps.items()}, coords)
    return Localisation(verdict, reason, dumps)


def locate_stall(pids: Mapping[Hashable, int], slots: Mapping[Hashable, int], *,
                 fault_dir: str | os.PathLike | None = None, rounds: int = 5,
                 dump: Callable[[Hashable], Dump] | None = None):
    """Dump every member's stacks up to ``rounds`` times until two rounds agree on the odd
    one's data-parallel group (byterobust §6). Returns ``(chosen, reason)`` from
    :func:`unbroken.core.stacks.vote` (``chosen`` None: no agreement). Slow (py-spy pauses each
    process in turn), so the supervisor runs it on a thread of its own."""
    from unbroken.core.stacks import vote

    coords = {u: Coord(slots[u], 0, 0) for u in pids}
    verdicts, reason, chosen, last, failed = [], "", None, "", 0
    for _ in range(rounds):
        loc = localise(pids, coords, fault_dir=fault_dir, dump=dump)
        verdicts.append(loc.verdict)
        last = loc.reason
        failed += sum(1 for d in loc.dumps.values() if d.method == FAILED)
        chosen, reason = vote(verdicts)
        if chosen is not None:
            break
    if chosen is None:  # say why, so an inconclusive stall at scale can be diagnosed
        reason += f"; last round: {last}; {failed} dump(s) failed in {len(verdicts)} round(s)"
    return chosen, reason
