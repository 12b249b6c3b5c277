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


# --------------------------------------------------------------------------------------------
# Node-aware placement
# --------------------------------------------------------------------------------------------
#
# Groups u and v share a shard type iff u + a_i == v + a_j (mod N) for some marks i != j, i.e.
# iff u - v == +-d (mod N) for a positive mark difference d = a_j - a_i. The "shares a type"
# conflict graph is therefore the circulant graph C_N(+-D), D the ruler's r(r-1)/2 differences.
# A node loss costs every type at most one host (no worse than one group failure, whatever
# else has failed) iff no node holds two adjacent groups: a placement is safe iff it is a
# proper colouring of that graph with the nodes as colours. Balanced (node sizes differ by at
# most 1) makes it an *equitable* colouring.

#: Above this many groups only the ring construction is tried (the exact search is
#: exponential in the worst case; below it, it answers in milliseconds for the layouts here).
SEARCH_MAX_GROUPS = 64
#: Search steps (assignments tried) before the exact search gives up; a step count, not a wall
#: time, so the answer is the same on every machine.
SEARCH_BUDGET = 20_000
#: Multipliers c tried by the ring construction (the first ones coprime to N).
MULTIPLIERS = 512


@dataclass(frozen=True)
class NodePlacement:
    """Groups on nodes: ``node_of[w]`` is group w's node.

    ``safe``: no node holds two groups that share a shard type. ``conflicts``: the pairs of
    groups on one node that do (empty when safe). ``proved``: the answer is certain (a safe
    placement was found, or none exists); False when the search gave up, so a safe placement
    may still exist. ``reason``: one line saying which of these holds and why.
    """

    nodes: int
    node_of: tuple[int, ...]
    safe: bool
    conflicts: tuple[tuple[int, int], ...]
    reason: str
    proved: bool = True

    def groups_on(self, node: int) -> tuple[int, ...]:
        return tuple(w for w, k in enumerate(self.node_of) if k == node)


def differences(layout: Layout) -> tuple[int, ...]:
    """The ruler's positive pairwise mark differences (distinct, and distinct modulo N)."""
    a = layout.offsets
    return tuple(sorted(a[j] - a[i] for i in range(len(a)) for j in range(i + 1, len(a))))


def check_nodes(groups: int, nodes: int) -> None:
    """Raise ValueError (one line naming the value) unless 1 <= nodes <= groups."""
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    if nodes > groups:
        raise ValueError(f"nodes {nodes} exceeds the number of groups {groups}: a node would "
                         "hold no group")


def _type_masks(layout: Layout) -> list[int]:
    """Group w's shard types as a bit set: two groups conflict iff their masks intersect."""
    return [sum(1 << int(t) for t in set(layout.stacks[w].tolist()))
            for w in range(layout.groups)]


def conflicts(layout: Layout, node_of) -> tuple[tuple[int, int], ...]:
    """Pairs (u, v), u < v, of groups on one node that share a shard type; O(N r^2): two
    groups share at most one type, so walking each type's hosts lists every pair once."""
    out = set()
    for t in range(layout.groups):
        hs = layout.hosts(t)
        out.update((min(u, v), max(u, v)) for i, u in enumerate(hs) for v in hs[i + 1:]
                   if node_of[u] == node_of[v])
    return tuple(sorted(out))


def node_loss_safe(layout: Layout, node_of) -> tuple[bool, str]:
    """Whether losing any one node costs every shard type at most one host, and why not.

    The runtime's check of a placement it was given (by hand, or by a scheduler): pure, O(N r).
    With r == 1 nothing is safe (a type's only host is lost with its node). When unsafe, the
    reason names the first conflict, and says when that node's loss is an outright wipe-out
    (all r hosts of a type on it) rather than a spent level of redundancy.
    """
    n, r = layout.groups, layout.redundancy
    if len(node_of) != n:
        raise ValueError(f"node_of has {len(node_of)} entries for {n} groups")
    if r < 2 and n:
        return False, (f"redundancy {r}: each shard type has one host, so any node loss "
                       "loses the types of its groups")
    bad = conflicts(layout, node_of)
    if not bad:
        return True, (f"safe: no node holds two groups that share a shard type (a node loss "
                      f"costs each type at most 1 of its {r} hosts)")
    u, v = bad[0]
    t = sorted(set(layout.stack(u)) & set(layout.stack(v)))[0]
    node = int(node_of[u])
    on = sum(1 for h in layout.hosts(t) if int(node_of[h]) == node)
    wipe = " (a wipe-out)" if on == r else ""
    return False, (f"unsafe: node {node} holds groups {u} and {v}, which share shard type {t}: "
                   f"its loss takes {on} of that type's {r} hosts{wipe}; {len(bad)} such "
                   "pair(s) in all")


def _clique_run(layout: Layout) -> int:
    """The largest m with 1..m all differences: groups 0..m then pairwise conflict."""
    d, m = set(differences(layout)), 0
    while m + 1 in d:
        m += 1
    return m


def _infeasible(layout: Layout, nodes: int) -> str | None:
    """A proof that no balanced safe placement on ``nodes`` exists, or None.

    Two bounds. Clique: the r hosts of a type pairwise conflict, and so do groups 0..m when
    1..m are all differences, so fewer nodes than max(r, m+1) cannot separate them. Spacing:
    on the ring, two groups on one node are more than m apart, so a node holds at most
    floor(N / (m+1)) groups, and a balanced placement puts ceil(N / nodes) on some node.
    """
    n, r = layout.groups, layout.redundancy
    m = _clique_run(layout)
    if nodes < max(r, m + 1):
        why = (f"the {r} hosts of a shard type" if r >= m + 1
               else f"groups 0..{m} (every difference 1..{m} is a ruler difference)")
        return f"{why} pairwise share a type, so they need {max(r, m + 1)} distinct nodes"
    most = n // (m + 1) if m else n
    if -(-n // nodes) > most:
        return (f"a balanced placement puts {-(-n // nodes)} groups on some node, but groups "
                f"on one node must be more than {m} apart on the ring of {n}, so at most "
                f"{most} fit")
    return None


def _ring(layout: Layout, nodes: int) -> tuple[tuple[int, ...], int, int]:
    """The ring construction node(w) = (c*w mod N) mod nodes over the multipliers c tried:
    the first conflict-free one, else the one with the fewest conflicts; (node_of, c, #bad)."""
    n = layout.groups
    d = np.asarray(differences(layout), dtype=np.int64)
    c_all = np.arange(1, n // 2 + 1, dtype=np.int64)
    cs = c_all[np.gcd(c_all, n) == 1][:MULTIPLIERS].tolist() or [1]
    e = (np.asarray(cs, dtype=np.int64)[:, None] * d[None, :]) % n
    # c*w mod N is a bijection of the ring, so every pair that conflicts has images x, y with
    # x - y in {+-e, +-(N-e)}; mod nodes puts them together iff nodes divides e or N-e
    bad = ((e % nodes == 0) | ((n - e) % nodes == 0)).sum(axis=1) if d.size else \
        np.zeros(len(cs), dtype=np.int64)
    i = int(np.argmin(bad))  # first minimum: deterministic
    c = cs[i]
    node_of = tuple(int((c * w) % n) % nodes for w in range(n))
    return node_of, c, int(bad[i])


def _search(layout: Layout, nodes: int, budget: int) -> tuple[tuple[int, ...] | None, bool]:
    """Exact search for a balanced proper colouring: (node_of or None, complete).

    Backtracking, most-constrained group first (DSatur's rule), with a node's shard types as a
    bit set so "may w go on k" is one AND; node sizes capped at ceil(N/nodes) with at most
    N mod nodes nodes at the cap (so a full assignment is balanced); empty nodes are
    interchangeable, so only the first empty one is tried. ``complete`` is False when
    ``budget`` assignments ran out before an answer.
    """
    n = layout.groups
    masks = _type_masks(layout)
    q, s = divmod(n, nodes)
    used, size = [0] * nodes, [0] * nodes
    node_of = [-1] * n
    state = {"full": 0, "opened": 0, "steps": 0}

    def options(w: int) -> list[int]:
        out = []
        for k in range(min(state["opened"] + 1, nodes)):
            if used[k] & masks[w] or size[k] == q + 1 or (size[k] == q and state["full"] >= s):
                continue
            out.append(k)
        return out

    def go(left: int) -> bool | None:  # True found, False exhausted, None out of budget
        if left == 0:
            return True
        best, best_opts = -1, None
        for w in range(n):
            if node_of[w] < 0:
                o = options(w)
                if best_opts is None or len(o) < len(best_opts):
                    best, best_opts = w, o
                    if not o:
                        return False
        for k in best_opts:
            state["steps"] += 1
            if state["steps"] > budget:
                return None
            grew = size[k] == q
            opened = k == state["opened"]
            node_of[best], used[k], size[k] = k, used[k] | masks[best], size[k] + 1
            state["full"] += grew
            state["opened"] += opened
            res = go(left - 1)
            if res is not False:
                return res
            node_of[best], used[k], size[k] = -1, used[k] & ~masks[best], size[k] - 1
            state["full"] -= grew
            state["opened"] -= opened
        return False

    res = go(n)
    return (tuple(node_of) if res else None), res is not None


def node_placement(layout: Layout, nodes: int, budget: int = SEARCH_BUDGET) -> NodePlacement:
    """Place the N groups on ``nodes`` nodes, balanced, so that a node loss is safe if it can be.

    Safe means no node holds two groups that share a shard type: a node loss then costs each
    type at most one of its r hosts, exactly what one group failure costs, so with r >= 2 it
    never wipes out, and the closed forms' "one failure at a time" reading still holds. (A
    node loss wipes out only when a node holds *all* r hosts of a type; the rule here is the
    stronger one so a node loss never spends more than one level of any type's redundancy.)

    Method, in order (deterministic; each step's cost in brackets):

    1. Bounds (``_infeasible``) that prove no balanced safe placement exists [O(r^2)].
    2. The ring construction node(w) = (c*w mod N) mod nodes, c coprime to N [O(M r^2), M <=
       512 multipliers]. Theorem: it is safe iff, for every difference d, ``nodes`` divides
       neither e = c*d mod N nor N - e. Proof: w -> c*w mod N permutes the ring, and u, v
       conflict iff u - v == +-d (mod N), so their images x, y satisfy x - y == +-e (mod N),
       i.e. x - y is one of +-e, +-(N - e) as integers in (-N, N). x mod nodes == y mod nodes
       iff ``nodes`` divides x - y. Conversely, if ``nodes`` divides e (or N - e), the images
       x = e, y = 0 (or x = N - e, y = 0) exist and conflict. Node sizes: w mod nodes over
       0..N-1 differ by at most 1, and the permutation keeps that.
    3. When N <= SEARCH_MAX_GROUPS, an exact backtracking search (``_search``) over the
       conflict graph [exponential worst case, capped at ``budget`` assignments; milliseconds
       for the layouts of the docs' table]. It answers both ways: a placement, or a proof
       (the search space exhausted) that none exists.

    When nothing is safe, ``node_of`` is the ring construction with the fewest conflicts, and
    ``proved`` says whether "no safe balanced placement exists" is certain (steps 1 or 3
    exhausted) or only "none found" (N too large for the search, or out of budget).
    Raises ValueError unless 1 <= nodes <= N.
    """
    check_nodes(layout.groups, nodes)
    n, r = layout.groups, layout.redundancy
    ring, c, nbad = _ring(layout, nodes)

    def unsafe(why: str, proved: bool) -> NodePlacement:
        return NodePlacement(nodes, ring, False, conflicts(layout, ring), why, proved)

    if r < 2:
        return unsafe(f"redundancy {r}: each shard type has one host, so no placement keeps a "
                      "node loss safe", True)
    if (why := _infeasible(layout, nodes)) is not None:
        return unsafe(f"no balanced safe placement of {n} groups on {nodes} nodes: {why}", True)
    if nbad == 0:
        return NodePlacement(nodes, ring, True, (),
                             f"safe: node = ({c}*group mod {n}) mod {nodes}; no node holds two "
                             "groups that share a shard type", True)
    if n <= SEARCH_MAX_GROUPS:
        found, complete = _search(layout, nodes, budget)
        if found is not None:
            return NodePlacement(nodes, found, True, (),
                                 "safe: found by exact search; no node holds two groups that "
                                 "share a shard type", True)
        if complete:
            return unsafe(f"no balanced safe placement of {n} groups on {nodes} nodes (exact "
                          "search, every placement ruled out)", True)
        return unsafe(f"no balanced safe placement of {n} groups on {nodes} nodes found "
                      f"(the exact search gave up after {budget} steps)", False)
    return unsafe(f"no balanced safe placement of {n} groups on {nodes} nodes found (the ring "
                  f"construction fails for every multiplier tried, and N > "
                  f"{SEARCH_MAX_GROUPS} is beyond the exact search)", False)


def nodes_needed(layout: Layout, budget: int = SEARCH_BUDGET) -> tuple[int | None, str]:
    """The fewest nodes with a safe balanced placement (``node_placement`` is safe), and why.

    Tries nodes = lower bound, lower bound + 1, ... N and returns the first that is safe
    (nodes = N always is for r >= 2: one group per node). The answer is the minimum (the
    equitable chromatic number of the conflict graph) when every smaller count was proved
    impossible; otherwise it is an upper bound and the reason says so. Balanced colourings
    are not monotone in general, so a count above this one is not guaranteed safe: ask
    ``node_placement`` for that count. None when r < 2 (no count is safe).
    Cost: at most N - bound placements; for the ring layouts the construction usually
    succeeds at the bound, so O(M r^2) in practice.
    """
    n, r = layout.groups, layout.redundancy
    if r < 2:
        return None, f"redundancy {r}: no number of nodes keeps a node loss safe"
    low = next(k for k in range(1, n + 1) if _infeasible(layout, k) is None)
    unproved = []
    for k in range(low, n + 1):
        if n > SEARCH_MAX_GROUPS:  # the construction alone: skip node_placement's report
            if _ring(layout, k)[2] == 0:
                break
            unproved.append(k)
            continue
        p = node_placement(layout, k, budget)
        if p.safe:
            break
        if not p.proved:
            unproved.append(k)
    else:  # pragma: no cover - one group per node is always safe for r >= 2
        raise AssertionError(f"no safe placement of {n} groups, r={r}")
    if unproved:
        return k, (f"{k} nodes: an upper bound; {len(unproved)} smaller count(s) from "
                   f"{unproved[0]} (the bounds' least) were not ruled out")
    return k, f"{k} nodes: the minimum (every smaller count is ruled out)"


def node_summary(layout: Layout, nodes: int) -> dict:
    """``node_placement`` and ``nodes_needed`` as plain data (what ``--json`` prints)."""
    p = node_placement(layout, nodes)
    need, need_why = nodes_needed(layout)
    return {"nodes": nodes, "groups": layout.groups, "redundancy": layout.redundancy,
            "safe": p.safe, "proved": p.proved, "node_of": list(p.node_of),
            "groups_on": [list(p.groups_on(k)) for k in range(nodes)],
            "conflicts": [list(x) for x in p.conflicts], "reason": p.reason,
            "nodes_needed": need, "nodes_needed_reason": need_why}
