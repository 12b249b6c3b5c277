"""The ranks of one group agree on every step's outcome and every generation they enter.

Why: a group of R ranks runs R communicators, one per plane (rank k with rank k of the other
groups, :mod:`unbroken.runtime.ftcomm`), and each plane's op can end differently: a rank of
another group that dies breaks its own plane's op while the other planes' ops complete. A
group whose ranks then disagreed -- one commits, its sibling re-forms -- would apply half an
optimizer step. So after each step's ops the ranks of a group make one small all-reduce over
their own process group (torch's default group, which holds exactly them):

* **the outcome**: the step commits on every rank or on none; a rank whose own op completed
  while a sibling's failed breaks its plane's generation (``comm.fail``), so every plane
  re-forms and the settle rolls the group forward like any member one commit behind;
* **the control values**: the join count, code-record count and stop request are read from
  the store by each plane's rank 0 at its own moment; rank 0's plane (plane 0) is the one
  every group reads, so the other ranks take its values, and a lost coordinator on any plane
  stops every rank;
* **the step check**: a NaN or a mismatch seen in one plane's reduced shard is the group's
  incident on every rank (the most severe kind found);
* **the loss**: each rank reports the loss of its own part of the shards (FSDP), and the step's
  loss is the mean over the group's ranks -- in the same all-reduce, not one of its own.

After a re-form (:meth:`same_members`) the ranks check that their planes formed the same
member list; a plane that formed another (a group judged silent on one plane only) is broken
again until they agree -- the death notice of a group is shared by every plane, so they do.

A sibling that died breaks these collectives (and FSDP's, inside the step) with a gloo error
at once: the rank that sees it declares its group dead -- one death notice, which every plane's
members read, so all of them drop the group in the same re-form -- and leaves (exit 11,
``GROUP_FENCED``); the launcher kills what is left of the group. A sibling that hung blocks
them instead, until the rank's heartbeat finds it silent and does the same
(``FTComm._sibling_lost``). Either way the rank journals why first (``group_fenced``,
``FTComm.fence_group``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from unbroken.core.ranks import FINDINGS, group_finding
from unbroken.runtime import stepbuf as sb

__all__ = ["GroupSync", "is_group_error"]


def is_group_error(exc: BaseException) -> bool:
    """A collective of the group broken by a rank that is gone (gloo's or NCCL's transport
    error), not the model's own error."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "gloo" in text or "Connection closed by peer" in text or "NCCL" in text)

#: the agreement vector: failed ranks, plane 0's join/code/stop counters, lost coordinator,
#: the loss, then one count a step-check kind (``core.ranks.FINDINGS``)
_FOUND = 6


class GroupSync:
    """Rank ``rank`` of a group of ``ranks`` (torch's default group is the group's)."""

    def __init__(self, rank: int, ranks: int) -> None:
        self.rank, self.ranks = rank, ranks
        # a process group of the same ranks for the durable checkpoint, which the group saves
        # together on a background thread while training goes on over the default one
        self.ckpt_pg = dist.new_group(backend="gloo")
        # rank 0's pid: names the group's temporary checkpoint directory (a crashed writer's
        # is removed when that pid is gone)
        v = torch.tensor([float(os.getpid()) if rank == 0 else 0.0], dtype=torch.float64)
        dist.all_reduce(v)
        self.leader_pid = int(v[0])

    def agree(self, runner: Any, ok: bool, buf: Any,
              found: tuple[str, dict] | None) -> tuple[bool, tuple[str, dict] | None]:
        """The group's outcome of this step's op: (every rank's op completed, the step check's
        finding). On a rank other than 0, ``buf``'s control cells become plane 0's."""
        v = torch.zeros(_FOUND + len(FINDINGS), dtype=torch.float64)
        if not ok:
            v[0] = 1.0
        else:
            if self.rank == 0:
                v[1], v[2], v[3] = float(buf[sb.JOIN]), float(buf[sb.CODE]), float(buf[sb.STOP])
            v[4] = float(buf[sb.LOST])
            v[5] = float(buf[sb.LOSS])
            if found is not None:
                v[_FOUND + FINDINGS.index(found[0])] = 1.0
        self._all_reduce(runner.comm, v)
        if v[0] > 0:
            if ok:  # my plane committed, a sibling's did not: nobody in my plane may commit
                runner.comm.fail(f"{int(v[0])} rank(s) of the group failed the step's op")
            return False, None
        if self.rank != 0:
            buf[sb.JOIN], buf[sb.CODE], buf[sb.STOP] = v[1], v[2], v[3]
        buf[sb.LOST] = v[4]
        # the step's loss: the mean of the ranks' (FSDP: each rank's equal part of every
        # shard; TP: the same value on every rank)
        buf[sb.LOSS] = v[5] / self.ranks
        runner._region = None  # the cells it read before are stale now
        kind = group_finding(v[_FOUND:].tolist())
        if kind is None:
            return True, None
        if found is not None and found[0] == kind:
            return True, found
        return True, (kind, {"found_by": "another rank of the group"})

    def broken(self, comm: Any, exc: BaseException) -> None:
        """A sibling is gone: declare this group dead (every plane drops it at its next
        re-form, the same one) and leave; the launcher fences the rest of the group."""
        from unbroken.runtime.ftcomm_ops import short_error

        comm.fence_group(f"a collective of the group failed: {short_error(exc)}")

    def _all_reduce(self, comm: Any, v: torch.Tensor, op: Any = None) -> None:
        try:
            dist.all_reduce(v) if op is None else dist.all_reduce(v, op=op)
        except RuntimeError as exc:
            self.broken(comm, exc)

    def same_members(self, comm: Any, members: list[int]) -> bool:
        """Whether every rank's plane formed its new generation with these members (the
        planes count their generations apart: only the members must match)."""
        h = float(hash(tuple(members)) & ((1 << 52) - 1))
        v = torch.tensor([h, -h], dtype=torch.float64)
        self._all_reduce(comm, v, dist.ReduceOp.MAX)
        return float(v[0]) == -float(v[1])
