"""What a group of several ranks concludes from its ranks' reports (pure).

A group is R processes that fail, step and answer incidents as one (``runtime.groupsync``,
``supervise.rankgroup``). These are the places its ranks' separate views are folded into the
group's one: the step check's finding, and the group's exit status (and whether that status
is the group's loss).
"""

from __future__ import annotations

from collections.abc import Sequence

from unbroken.protocol import ExitCode

__all__ = ["FINDINGS", "group_finding", "group_status", "lost_status"]

#: what a rank's step check can find, least severe first (a code error outranks a NaN, which
#: outranks a digest mismatch: the ladder answers the graver one)
FINDINGS = ("sdc", "implicit", "code")


def group_finding(counts: Sequence[float]) -> str | None:
    """The group's finding from the ranks found each kind (``counts[i]``: ranks that found
    ``FINDINGS[i]``, summed over the group): the most severe kind any rank found, or None.
    Counts, not codes, travel through the summing all-reduce: two ranks that find the same
    NaN must not add up to another kind."""
    found = [k for k, n in zip(FINDINGS, counts) if n > 0]
    return found[-1] if found else None


def group_status(codes: Sequence[int | None]) -> tuple[int, int] | None:
    """(rank, status) of the group whose ranks' exit statuses are ``codes`` (None: running),
    or None while it has none: the first failure found -- a rank killed by a signal (the
    fault) before one that exited on its own (a rank that noticed it), then the lowest rank --
    or (0, 0) once every rank exited 0."""
    bad = [(k, c) for k, c in enumerate(codes) if c not in (None, 0)]
    if bad:
        return min(bad, key=lambda kc: (kc[1] >= 0, kc[0]))
    if all(c == 0 for c in codes):
        return 0, 0
    return None


def lost_status(status: int) -> bool:
    """Whether a group (or a one-rank worker) that exited with ``status`` is *lost* -- killed by
    a signal, left out of a generation (``JOIN_FAILED``), or fenced by one of its own ranks
    (``GROUP_FENCED``) -- so the survivors must drop it and a spare replace it; any other
    non-zero status is an outcome the job handles otherwise (an error, a stop, a wipe-out)."""
    return status < 0 or status in (ExitCode.JOIN_FAILED, ExitCode.GROUP_FENCED)
