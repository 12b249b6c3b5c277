"""The run directory: never destroy a resume point, never start on one that cannot be read.

A run directory holds ``journal.jsonl`` (the supervisor's merged journal), ``groups/`` (each
worker's own journal, the exactly-once ledger's source), ``ckpt/`` (durable checkpoints) and
the report's figure. Three ways in, decided before any process starts:

* a new directory (or one without a previous run): start at step 0;
* ``resume``: continue from the newest checkpoint that verifies; if there is none (a mistyped
  directory, every checkpoint corrupt) refuse with ``NoResumePoint`` (exit 7) instead of
  silently training from step 0;
* ``fresh`` in a directory that holds a run: the previous run's files move to
  ``previous-<UTC time>/`` beside them (kept, not deleted); without ``fresh`` or ``resume``
  such a directory is refused (exit 2).

Journals are appended line by line; a worker killed mid-write can leave a last line without
its newline. ``read_journal`` skips such a tail and ``repair_journals`` cuts it off before a
resumed run appends, so the next line does not fuse with it; a malformed line anywhere else is
a ``JournalError`` naming the file and line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

__all__ = ["OutDirError", "NoResumePoint", "JournalError", "prepare", "read_journal",
           "repair_journals", "RUN_FILES"]

#: what one run writes into its directory (moved aside together by ``fresh``)
RUN_FILES = ("journal.jsonl", "groups", "ckpt", "kernel.log", "demo.png", "run.png")


class OutDirError(ValueError):
    """The run directory cannot be used (bad input, exit 2)."""


class NoResumePoint(OutDirError):
    """``--resume`` found nothing valid to continue from (exit 7)."""


class JournalError(ValueError):
    """A journal line that is not JSON (not a cut-off last line): names the file and line."""


def _has_run(out: Path) -> bool:
    return (out / "journal.jsonl").exists() or any((out / "ckpt").glob("step-*")) or any(
        (out / "groups").glob("group-*.jsonl"))


def prepare(out: Path, *, resume: bool, fresh: bool, now: float | None = None) -> dict:
    """Make ``out`` ready for a run; returns what was found (``resume_step``, ``kept_in``).
    Raises :class:`OutDirError` / :class:`NoResumePoint` with one line naming the path."""
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out}: exists and is not a directory")
    if resume and not _has_run(out):  # a mistyped path is not created, nor trained from 0
        raise NoResumePoint(f"--resume: {out} holds no previous run (no journal, no "
                            f"checkpoint); check the path, or drop --resume to start")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutDirError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    found: dict = {"resume_step": None, "kept_in": None}
    if resume:
        from unbroken.runtime.checkpoint import CheckpointStore

        bad: list[str] = []
        latest = CheckpointStore(out / "ckpt", log=bad.append).latest() \
            if (out / "ckpt").is_dir() else None
        if latest is None:
            why = f"{len(bad)} checkpoint(s), none verifies" if bad else "no checkpoint"
            raise NoResumePoint(f"--resume: {out / 'ckpt'}: {why}; --fresh starts over "
                                f"(the previous run is kept)")
        found["resume_step"] = latest[0]
        return found
    if _has_run(out):
        if not fresh:
            raise OutDirError(f"--out {out} holds a previous run: --resume continues it, "
                              f"--fresh starts over and keeps it in {out}/previous-<time>/")
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None
                                                           else now))
        keep = out / f"previous-{stamp}"
        n = 1
        while keep.exists():
            n += 1
            keep = out / f"previous-{stamp}-{n}"
        keep.mkdir()
        for name in RUN_FILES:
            if (out / name).exists():
                os.replace(out / name, keep / name)
        found["kept_in"] = str(keep)
    return found


def read_journal(path: Path) -> list[dict]:
    """Every event of a JSONL journal; a last line cut off mid-write is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            raise JournalError(f"{path}:{i}: not a JSON line ({line[:60]!r}); the journal "
                               f"is damaged") from None
    del tail  # an incomplete last line: the writer died in the middle of it
    return out


def repair_journals(out: Path) -> list[str]:
    """Cut a cut-off last line from the run's journals (before a resumed run appends to them);
    returns the files repaired."""
    fixed = []
    for path in [out / "journal.jsonl", *sorted((out / "groups").glob("group-*.jsonl"))]:
        if not path.exists():
            continue
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
            fixed.append(str(path))
        read_journal(path)  # a damaged line in the middle: JournalError names it now
    return fixed
