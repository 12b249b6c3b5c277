"""What a run ends with: the result the supervisor returns, and the two ways an attempt ends
early (the ladder's restart, the members' stop on purpose), raised by the attempt and caught
by the supervisor's loop over attempts."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from unbroken.protocol import ExitCode

__all__ = ["RunError", "RunResult", "Restart", "Ended", "params_sha256"]


class RunError(RuntimeError):
    """The run could not finish (a worker error, no survivor, a timeout): exit 1."""


@dataclass
class RunResult:
    """What :meth:`Supervisor.run` returns: the exit code, one line when it is not 0, the
    report (``unbroken.demo_report.build_report`` keys) and every finisher's final params."""

    code: ExitCode
    message: str | None
    report: dict
    params: dict[int, list] = field(default_factory=dict)
    checkpoint: str | None = None

    @property
    def ok(self) -> bool:
        return self.code == ExitCode.OK


def params_sha256(params: dict[int, list]) -> str | None:
    """One digest of the finishers' final parameters (float64 bytes, little-endian), or None
    when they disagree or none finished. Every group holds the same parameters after the
    last commit, so one value says "this trajectory": two runs of a seed (one through
    failures, a takeover) compare it bit for bit."""
    digests = {hashlib.sha256(struct.pack(f"<{len(p)}d", *p)).hexdigest()
               for p in params.values()}
    return digests.pop() if len(digests) == 1 else None


class Restart(Exception):
    """The ladder decided to restart every group from the durable checkpoint (after
    ``backoff`` seconds)."""

    def __init__(self, reason: str, backoff: float = 0.0) -> None:
        super().__init__(reason)
        self.backoff = backoff


class Ended(Exception):
    """Every member stopped on purpose (a stop request, a silent supervisor, the ladder)."""

    def __init__(self, code: ExitCode, message: str, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.code, self.checkpoint = code, checkpoint

