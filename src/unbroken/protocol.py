"""The contract between the supervisor and its workers: exit codes and the store keys it adds.

Why one file: an exit code is read by a process that did not write it (the supervisor reads a
worker's, a shell script or a scheduler reads the supervisor's), and a store key is written in
one process and waited on in another. Defined here once, both sides agree by construction.

Exit codes (a worker's and the ``unbroken`` command's; the command adds 1, 2 and 7):

====  ==================  ==============================================================
0     OK                  finished every step
1     FAILED              the run could not finish (a worker error, no survivor)
2     USAGE               bad input: one line naming it, nothing started
3     WORKER_ERROR        a worker raised (its traceback is in ``error/<uid>``)
4     WIPEOUT             a wipe-out no spare could cover (the supervisor restarts the job)
5     COORDINATOR_LOST    the store or the supervisor went silent: every member stopped after
                          the same committed step and a checkpoint of it was written;
                          ``--resume`` continues
6     NO_PROGRESS         the guard's ladder gave up (``core.ladder.EXIT_NO_PROGRESS``)
7     NO_RESUME_POINT     ``--resume`` found no valid checkpoint (or no previous run at all)
8     STOPPED             stopped on request (SIGINT/SIGTERM to the supervisor): every member
                          stopped after the same committed step, a checkpoint was written
130   INTERRUPTED         the ``unbroken`` command after Ctrl-C (128 + SIGINT), state saved
143   TERMINATED          the ``unbroken`` command after SIGTERM (128 + SIGTERM), state saved
====  ==================  ==============================================================
"""

from __future__ import annotations

import enum

__all__ = ["ExitCode", "SUPERVISOR_HB", "STOP_KEY"]


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    WORKER_ERROR = 3
    WIPEOUT = 4
    COORDINATOR_LOST = 5
    NO_PROGRESS = 6
    NO_RESUME_POINT = 7
    STOPPED = 8
    INTERRUPTED = 130
    TERMINATED = 143


#: the supervisor's heartbeat counter: bumped every ``heartbeat`` seconds by a thread of the
#: supervisor; members treat it going stale like the store going away (exit 5 with a checkpoint)
SUPERVISOR_HB = "hb/supervisor"

#: set by the supervisor on SIGINT/SIGTERM; rank 0 reads it into the step buffer so every member
#: stops after the same committed step (exit 8)
STOP_KEY = "ctl/stop"
