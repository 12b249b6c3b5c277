"""What the stacked runner needs from its communicator: the extension point between the
training loop and the fault-tolerant collective.

:class:`~unbroken.runtime.ftcomm.FTComm` (gloo/NCCL, generation-numbered groups) is the real
one; ``tests/runtime/fakecomm.py`` drives the runner in threads against an in-memory one, and
``unbroken.testing.faults.DropCommit`` wraps either to inject faults. Writing the contract down
keeps the three from drifting apart.

Failure semantics every implementation keeps:

* ``allreduce(t)`` sums ``t`` in place across ``members`` and returns True when this member
  received every contribution. False: the generation broke; ``t`` is abandoned (the caller
  passes a fresh buffer next time) and the caller calls ``reform``. True on one member does not
  mean True on all (a peer may fail in the same op): the runner's settle reconciles that.
* ``reform(expect, planned=...)`` forms generation g+1 among the live members (plus the joiners
  ``expect`` names) and returns its members; ``planned`` (an admission at a step boundary) does
  not abort generation g. ``join(gen)`` is the joiner's side.
* ``fail(reason)`` breaks the current generation from the caller's side (every member's op
  fails and they re-form).

Optional: ``watch(keys)`` / ``watched`` (store counters read off the step's critical path) and
``supervisor_lost``; the runner falls back to asking ``store`` when ``watch`` is missing.
``offer(report)`` / ``reports``: a JSON value this member publishes with the next ``reform``
or ``join``, and ``(generation, {uid: report})`` once every member of it offered one (else
None); the runner's settle then reads them instead of spending an all-reduce, and falls back
to the all-reduce when they are missing. Whether they are there must be the same for every
member of a generation (FTComm: one record, the member list, carries them all).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["CommLike"]


@runtime_checkable
class CommLike(Protocol):
    store: Any            # the coordinator's key-value store (a torch.distributed.Store)
    store_lost: bool      # the store stopped answering: stop after the next commit

    @property
    def generation(self) -> int: ...

    @property
    def members(self) -> list[int]: ...

    @property
    def rank(self) -> int: ...

    def allreduce(self, tensor: torch.Tensor) -> bool: ...

    def reform(self, expect: list[int] | tuple[int, ...] = (), *,
               planned: bool = False) -> list[int]: ...

    def join(self, gen: int) -> list[int]: ...

    def fail(self, reason: str) -> None: ...
