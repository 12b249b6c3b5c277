"""The step buffer's wire format: what every member appends to its gradient before the
step's one all-reduce, and how the reduced buffer is read back.

Layout (float64, summed element-wise by the all-reduce)::

    [ gradient (numel) | coverage (N) | digests (N*N, when sdc_every > 0) | tail (8) ]

* coverage[t]: 1.0 from the member that contributed shard type t; the sum must read all
  ones (every type exactly once) for the step to commit.
* digests[t*N + w]: a 52-bit digest of type t's gradient as slot w computed it (0: not
  computed); a float64 holds 52 bits exactly, so a sum with one writer per cell is the value.
* tail (negative indices): STOP, ERR (members whose step raised), CODE (code records seen
  by rank 0), LOSS (sum of the contributed types' losses), JOIN (join records seen by rank
  0), LOST (members that lost the coordinator), COUNT (members, each adds 1) and STEP (each
  adds its step: the sum must be step x COUNT, or members were at different steps).

Carrying the check in the gradient's own collective makes it free of extra round trips and
impossible to disagree on: every member reads the same reduced bytes.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["STOP", "ERR", "CODE", "LOSS", "JOIN", "LOST", "COUNT", "STEP", "TAIL", "buflen",
           "joins_reported", "digest52", "digests"]

STOP, ERR, CODE, LOSS, JOIN, LOST, COUNT, STEP = range(-8, 0)
TAIL = 8


def buflen(numel: int, groups: int, sdc: bool) -> int:
    """Length of the step buffer for a model of ``numel`` parameters at ``groups`` groups."""
    return numel + groups + (groups * groups if sdc else 0) + TAIL


def joins_reported(buf: torch.Tensor) -> int:
    """The join count rank 0 reported in a reduced step buffer."""
    return int(buf[JOIN])


def digest52(t: torch.Tensor) -> int:
    """A 52-bit digest of a tensor's bytes (never 0: 0 marks "not computed"); exact in a
    float64, so digests travel through the summing all-reduce unchanged."""
    h = int.from_bytes(hashlib.blake2b(t.detach().cpu().contiguous().numpy().tobytes(),
                                       digest_size=8).digest(), "little") & ((1 << 52) - 1)
    return h or 1


def digests(cells: torch.Tensor, types) -> dict[int, dict[int, int]]:
    """``{type: {slot: digest}}`` from summed digest cells (row i = ``types[i]``, column =
    slot; 0 = that slot did not compute the type)."""
    return {int(t): {w: int(cells[i, w]) for w in range(cells.shape[1])
                     if float(cells[i, w]) > 0}
            for i, t in enumerate(types)}
