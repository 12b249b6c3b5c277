"""Slurm job history: ``sacct --parsable2`` output, and the session membership it implies.

Why membership: the detector's peers are "the other nodes of the same session" (backendai.md
§2). A node the scheduler excluded sits idle while its former peers train; compared with them
it is an outlier every scrape, and that is not a precursor. ``sacct`` knows which nodes each
attempt ran on (``NodeList``, Slurm's compressed host list), so a node is a session member from
an attempt's start until the next attempt of the same job name starts (the idle minutes of a
retry chain included: the failed attempt's nodes stay each other's peers until the scheduler
has picked the next set).

Fields read (by header name, any order; others ignored): JobID, JobName, State, ExitCode, Start,
End (``Unknown`` while running), NodeList, and optionally Submit, Restarts and Comment. Comment
carries the retry wrapper's notes as ``key=value`` pairs separated by ``;``: ``retry=auto`` /
``retry=manual`` (how the attempt was submitted) and ``exclude=NODE[,NODE]`` (the nodes this
attempt's failure excluded). Job steps (``123.batch``, ``123.0``) are skipped.

A malformed row (wrong field count, an unreadable time) is skipped with a warning naming its
line number; a file with no readable row is an error.
"""

from __future__ import annotations

import calendar
import re
import time

import numpy as np

from unbroken.core.history import Attempt

__all__ = ["Job", "SacctError", "read_sacct", "parse_sacct", "expand_hostlist", "membership"]

REQUIRED = ("JobID", "JobName", "State", "Start", "End", "NodeList")


class SacctError(ValueError):
    """The file cannot be used at all (one line naming it)."""


Job = Attempt  # one scheduler job of a session (core.history.Attempt)


def expand_hostlist(text: str) -> list[str]:
    """``gpu[001-003,007],cpu1`` -> gpu001, gpu002, gpu003, gpu007, cpu1."""
    text = text.strip()
    if not text or text in ("None assigned", "(null)"):
        return []
    out = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if m is None:
            out.append(part)
            continue
        pre, ranges, post = m.groups()
        for r in ranges.split(","):
            if "-" in r:
                a, b = r.split("-", 1)
                if not (a.isdigit() and b.isdigit()) or int(b) < int(a):
                    raise ValueError(f"bad host range {r!r}")
                out.extend(f"{pre}{i:0{len(a)}d}{post}" for i in range(int(a), int(b) + 1))
            elif r.isdigit():
                out.append(f"{pre}{r}{post}")
            else:
                raise ValueError(f"bad host range {r!r}")
    return out


def _time(text: str) -> float | None:
    text = text.strip()
    if text in ("Unknown", "None", ""):
        return None
    return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))


def parse_sacct(lines: list[str], source: str = "sacct") -> tuple[list[Job], list[str]]:
    warnings: list[str] = []
    if not lines:
        raise SacctError(f"--sacct {source}: empty file")
    header = lines[0].rstrip("\n").split("|")
    missing = [f for f in REQUIRED if f not in header]
    if missing:
        raise SacctError(f"--sacct {source}: header lacks {', '.join(missing)} (expected "
                         f"sacct --parsable2 with {','.join(REQUIRED)})")
    col = {h: i for i, h in enumerate(header)}
    jobs = []
    for lineno, line in enumerate(lines[1:], 2):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        f = line.split("|")
        try:
            if len(f) != len(header):
                raise ValueError(f"{len(f)} fields, header has {len(header)}")
            get = lambda k, d="": f[col[k]] if k in col else d  # noqa: E731
            jid = get("JobID")
            if "." in jid:      # a job step
                continue
            start = _time(get("Start"))
            if start is None:   # never started (PENDING, cancelled before start)
                continue
            comment = dict(kv.split("=", 1) for kv in get("Comment").split(";") if "=" in kv)
            restarts = get("Restarts", "0")
            jobs.append(Attempt(job_id=jid, name=get("JobName"), state=get("State").split()[0],
                            exit_code=get("ExitCode"), start=start, end=_time(get("End")),
                            nodes=tuple(expand_hostlist(get("NodeList"))),
                            submit=_time(get("Submit")) if "Submit" in col else None,
                            restarts=int(restarts) if restarts.isdigit() else 0,
                            retry=comment.get("retry", ""),
                            excluded=tuple(x for x in comment.get("exclude", "").split(",")
                                           if x)))
        except (ValueError, IndexError) as e:
            warnings.append(f"{source}:{lineno}: malformed sacct row skipped ({e}): "
                            f"{line[:120]!r}")
    if not jobs:
        raise SacctError(f"--sacct {source}: no readable job row")
    jobs.sort(key=lambda j: j.start)
    return jobs, warnings


def read_sacct(path: str) -> tuple[list[Job], list[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError as e:
        raise SacctError(f"--sacct {path}: {e.strerror or e}") from None
    import os
    return parse_sacct(lines, source=os.path.basename(path))


def membership(jobs: list[Job], nodes: list[str], t: np.ndarray) -> np.ndarray:
    """(N, T) bool: node in the session at each scrape (see the module's docstring)."""
    idx = {n: i for i, n in enumerate(nodes)}
    out = np.zeros((len(nodes), len(t)), bool)
    by_name: dict[str, list[Job]] = {}
    for j in jobs:
        by_name.setdefault(j.name, []).append(j)
    for lst in by_name.values():
        for k, j in enumerate(lst):
            nxt = lst[k + 1].start if k + 1 < len(lst) else None
            end = nxt if nxt is not None else (j.end + 900.0 if j.end is not None else np.inf)
            cols = np.flatnonzero((t >= j.start) & (t < end))
            rows = [idx[n] for n in j.nodes if n in idx]
            if rows and len(cols):
                out[np.ix_(rows, cols)] = True
    return out
