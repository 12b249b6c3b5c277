"""Stacked shard placement: which data-parallel group holds which shard types.

Why a Golomb ruler
------------------
SPARe gives each of the N data-parallel groups a *stack* of r distinct shard types, and each
shard type lives on r groups. Group ``w`` holds the types ``(w + a_j) mod N`` for the marks
``a_0 < ... < a_{r-1}`` of a ruler. When all pairwise differences of the marks are distinct
modulo N (an optimal Golomb ruler, and ``N >= 2 * L_r + 1`` where ``L_r`` is its length), two
shard types share at most one group (the paper's independence condition, Thm 4.1). That is what
makes the closed form for the number of maskable failures hold: a type is lost only when all of
its r hosts have failed, and those r hosts are spread over the ring with no two types sharing a
pair of hosts.

The offsets are the optimal Golomb rulers of order 1..27, the same table the authors'
simulator uses.

Coverage questions over a layout live here too, pure: which shard types the live groups no
longer cover (``uncovered``: masking works iff there are none) and, when some are lost, which
holders a wipe-out names (``wiped_out``), so the supervisor only carries the answer out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

#: Optimal Golomb rulers, index r-1 gives the r marks (r = 1..27).
GOLOMB_RULERS: tuple[tuple[int, ...], ...] = (
    (0,),
    (0, 1),
    (0, 1, 3),
    (0, 1, 4, 6),
    (0, 1, 4, 9, 11),
    (0, 1, 4, 10, 12, 17),
    (0, 1, 4, 10, 18, 23, 25),
    (0, 1, 4, 9, 15, 22, 32, 34),
    (0, 1, 5, 12, 25, 27, 35, 41, 44),
    (0, 1, 6, 10, 23, 26, 34, 41, 53, 55),
    (0, 1, 4, 13, 28, 33, 47, 54, 64, 70, 72),
    (0, 2, 6, 24, 29, 40, 43, 55, 68, 75, 76, 85),
    (0, 2, 5, 25, 37, 43, 59, 70, 85, 89, 98, 99, 106),
    (0, 4, 6, 20, 35, 52, 59, 77, 78, 86, 89, 99, 122, 127),
    (0, 4, 20, 30, 57, 59, 62, 76, 100, 111, 123, 136, 144, 145, 151),
    (0, 1, 4, 11, 26, 32, 56, 68, 76, 115, 117, 134, 150, 163, 168, 177),
    (0, 5, 7, 17, 52, 56, 67, 80, 81, 100, 122, 138, 159, 165, 168, 191, 199),
    (0, 2, 10, 22, 53, 56, 82, 83, 89, 98, 130, 148, 153, 167, 188, 192, 205, 216),
    (0, 1, 6, 25, 32, 72, 100, 108, 120, 130, 153, 169, 187, 190, 204, 231, 233, 242, 246),
    (0, 1, 8, 11, 68, 77, 94, 116, 121, 156, 158, 179, 194, 208, 212, 228, 240, 253, 259, 283),
    (0, 2, 24, 56, 77, 82, 83, 95, 129, 144, 179, 186, 195, 255, 265, 285, 293, 296, 310, 329,
     333),
    (0, 1, 9, 14, 43, 70, 106, 122, 124, 128, 159, 179, 204, 223, 253, 263, 270, 291, 330, 341,
     353, 356),
    (0, 3, 7, 17, 61, 66, 91, 99, 114, 159, 171, 199, 200, 226, 235, 246, 277, 316, 329, 348,
     350, 366, 372),
    (0, 9, 33, 37, 38, 97, 122, 129, 140, 142, 152, 191, 205, 208, 252, 278, 286, 326, 332, 353,
     368, 384, 403, 425),
    (0, 12, 29, 39, 72, 91, 146, 157, 160, 161, 166, 191, 207, 214, 258, 290, 316, 354, 372, 394,
     396, 431, 459, 467, 480),
    (0, 1, 33, 83, 104, 110, 124, 163, 185, 200, 203, 249, 251, 258, 314, 318, 343, 356, 386,
     430, 440, 456, 464, 475, 487, 492),
    (0, 3, 15, 41, 66, 95, 97, 106, 142, 152, 220, 221, 225, 242, 295, 330, 338, 354, 382, 388,
     402, 415, 486, 504, 523, 546, 553),
)

MAX_REDUNDANCY = len(GOLOMB_RULERS)


class PlacementError(ValueError):
    """A (groups, redundancy) pair that no stacked layout can serve."""


def min_groups(redundancy: int) -> int:
    """Smallest N for which the order-r ruler keeps all differences distinct modulo N."""
    return 2 * GOLOMB_RULERS[redundancy - 1][-1] + 1


def max_redundancy(groups: int) -> int:
    """Largest r that a layout over ``groups`` groups supports (0 if none)."""
    best = 0
    for r in range(1, MAX_REDUNDANCY + 1):
        if r <= groups and groups >= min_groups(r):
            best = r
    return best


def check(groups: int, redundancy: int) -> None:
    """Raise PlacementError naming the violated limit, or return quietly."""
    if groups < 1:
        raise PlacementError(f"groups must be at least 1, got {groups}")
    if redundancy < 1:
        raise PlacementError(f"redundancy must be at least 1, got {redundancy}")
    if redundancy > MAX_REDUNDANCY:
        raise PlacementError(
            f"redundancy {redundancy} exceeds the largest known optimal Golomb ruler "
            f"(r <= {MAX_REDUNDANCY})")
    if redundancy > groups:
        raise PlacementError(f"redundancy {redundancy} exceeds the number of groups {groups}")
    need = min_groups(redundancy)
    if groups < need:
        raise PlacementError(
            f"groups {groups} too small for redundancy {redundancy}: the order-{redundancy} "
            f"Golomb ruler has length {GOLOMB_RULERS[redundancy - 1][-1]}, so N must be at "
            f"least 2*L+1 = {need} (largest r for N={groups} is {max_redundancy(groups)})")


@dataclass(frozen=True)
class Layout:
    """The static stacked layout for N groups and redundancy r.

    ``stacks[w, j]`` is the shard type group ``w`` holds at original position ``j``;
    ``hosts_of[t, j]`` is the group that holds type ``t`` at original position ``j``.
    """

    groups: int
    redundancy: int
    offsets: tuple[int, ...] = field(repr=False)
    stacks: np.ndarray = field(repr=False, compare=False)
    hosts_of: np.ndarray = field(repr=False, compare=False)

    def stack(self, w: int) -> tuple[int, ...]:
        """Shard types of group ``w`` in original stack order (top first)."""
        return tuple(int(x) for x in self.stacks[w])

    def hosts(self, t: int) -> tuple[int, ...]:
        """Groups that hold shard type ``t`` (position j in the original layout)."""
        return tuple(int(x) for x in self.hosts_of[t])


def make_layout(groups: int, redundancy: int) -> Layout:
    """Build the layout, raising PlacementError when (N, r) violates a limit."""
    check(groups, redundancy)
    offsets = GOLOMB_RULERS[redundancy - 1]
    a = np.asarray(offsets, dtype=np.int64)
    ids = np.arange(groups, dtype=np.int64)[:, None]
    stacks = (ids + a[None, :]) % groups
    hosts_of = (ids - a[None, :]) % groups
    stacks.setflags(write=False)
    hosts_of.setflags(write=False)
    return Layout(groups, redundancy, offsets, stacks, hosts_of)


def uncovered(layout: Layout, live: Iterable[int]) -> tuple[int, ...]:
    """Shard types with no host among the ``live`` groups: empty when the survivors can mask
    every failure so far (SPARe's condition), else the types a wipe-out lost."""
    alive = set(live)
    n = layout.stacks.shape[0]
    return tuple(t for t in range(n) if not alive.intersection(layout.hosts(t)))


def wiped_out(holder: Mapping[int, int], held: Iterable[int], lost: int
              ) -> tuple[tuple[int, ...], str]:
    """The groups a wipe-out names, and why: the last holder of every slot without a live
    holder, plus ``lost`` (the member whose loss made it a wipe-out).

    ``holder`` maps each slot to its newest holder (a uid); ``held`` are the slots some other
    member still holds. Naming every such slot, not only the lost one's, lets one ladder answer
    (evict with spares for all, or retry with fresh processes in all) refill every slot the
    survivors cannot cover; a slot lost earlier that is still empty is part of the same hole.
    """
    live = set(held)
    empty = sorted(s for s in holder if s not in live)
    gone = tuple(sorted({holder[s] for s in empty} | {lost}))
    return gone, f"wipe-out: slots {empty} have no live holder"
