"""RECTLR: the reordering controller that masks failed data-parallel groups.

Why three phases
----------------
When groups die in the middle of a step, the survivors must still deliver every shard type's
gradient exactly once before the all-reduce can commit. The cheapest answer is the one that
changes nothing, so the controller escalates only as far as it must:

* **fixed** (HK-FIXED) — the survivors' top-S positions already cover every type: keep the
  stacks and the depth, hand each orphaned type to a survivor that holds it within its top S.
* **free** (HK-FREE) — find the smallest depth S* in [S, r] at which a perfect matching of
  types to (survivor, position < S*) slots exists. If the survivors' current top-S* positions
  already cover every type, the stacks stay as they are and only the depth grows.
* **mcmf** — otherwise, among all perfect assignments at S*, take one that moves the fewest
  shards from their stack positions (ties: the fewest shards that need computing again), and
  reorder the stacks accordingly. Each stack stays a permutation of its group's own r types.

A type whose r hosts have all failed cannot be served at any depth (and conversely, at S = r
every survivor can serve all of its types), so that case is reported as a wipe-out, which the
caller answers with a restart.

The graph work runs in C (``scipy.sparse.csgraph``). Most decisions at scale never need a
matching: an assignment in which every type sits on its own cheapest edge meets the cost lower
bound, so it is optimal and proves its depth feasible. Otherwise the minimum-cost perfect
matching is completed by successive shortest augmenting paths, each one a C Dijkstra over
reduced costs; a depth with no augmenting path left is infeasible (Berge), which is phase 1's
answer. scipy's own Hopcroft-Karp and LAPJVsp are not used: in scipy <= 1.17 they share a DFS
that is exponential on layered graphs (scipy#26147), and the stacked layout near its tight
regime is one (seconds per decision at N = 10,000).

This module is pure: no I/O, no clock, no torch, so the simulator and the runtime call the
very same ``decide``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from unbroken.core.placement import Layout

FIXED, FREE, MCMF = "fixed", "free", "mcmf"


@dataclass(frozen=True)
class Plan:
    """A masked step: who computes what at which depth.

    Attributes:
        depth: the new stack depth S* (every survivor runs its top S* positions).
        stacks: (N, r) stack orders after the decision; rows of dead groups are unchanged.
        assignment: (N,) the group that contributes each shard type's gradient.
        position: (N,) the stack position (< depth) at which that group holds the type.
        phase: which phase decided: ``fixed``, ``free`` or ``mcmf``.
        moved: number of shard types placed at a stack position that did not hold them.
        patch: group -> shard types it must compute now, beyond what it computed this step.
        reason: one line that doubles as the log line.
    """

    depth: int
    stacks: np.ndarray
    assignment: np.ndarray
    position: np.ndarray
    phase: str
    moved: int
    patch: dict[int, tuple[int, ...]]
    reason: str

    def contributions(self) -> dict[int, tuple[int, ...]]:
        """group -> shard types whose gradient it contributes, in stack order."""
        out: dict[int, list[int]] = {}
        for t in np.lexsort((self.position, self.assignment)):
            out.setdefault(int(self.assignment[t]), []).append(int(t))
        return {w: tuple(ts) for w, ts in out.items()}


@dataclass(frozen=True)
class WipeOut:
    """No depth can cover every type: these types lost all of their hosts."""

    lost_types: tuple[int, ...]
    reason: str


Decision = Plan | WipeOut


def initial_stacks(layout: Layout) -> np.ndarray:
    """The original stack orders, as a writable copy."""
    return np.array(layout.stacks, copy=True)


class TopCover:
    """Phase 0 kept up to date failure by failure: how many live groups hold each type within
    their top ``depth`` positions.

    ``decide`` answers phase 0 with a count over all N x S top slots, O(N S) per call. A
    simulator or a Monte-Carlo that feeds failures one batch at a time can ask the same
    question in O(S) per failed group: the batch keeps every count above zero exactly when
    the survivors' top S still cover every type, and then ``decide`` would return the
    ``fixed`` plan with the stacks and the depth unchanged (a covered type has a live host, so
    no wipe-out either). Anything else must go to ``decide``, after which the cover is built
    anew from the plan's stacks and depth. Pure: arrays in, booleans out.
    """

    def __init__(self, stacks: np.ndarray, live: np.ndarray, depth: int) -> None:
        self.stacks, self.depth = stacks, depth
        self.counts = np.bincount(stacks[live, :depth].ravel(), minlength=stacks.shape[0])

    def _lost(self, failed: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        types = self.stacks[np.asarray(failed, dtype=np.int64), :self.depth].ravel()
        return np.unique(types, return_counts=True)

    def survives(self, failed: Sequence[int]) -> bool:
        """Would the top ``depth`` positions of the groups left after ``failed`` (all live
        now) still cover every type? True means ``decide`` answers ``fixed``, unchanged."""
        types, n = self._lost(failed)
        return bool(np.all(self.counts[types] > n))

    def remove(self, failed: Sequence[int]) -> None:
        """Take ``failed`` (live until now) out of the counts."""
        types, n = self._lost(failed)
        self.counts[types] -= n


def _live_mask(layout: Layout, live: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(live)
    if arr.dtype == bool:
        if arr.shape != (layout.groups,):
            raise ValueError(f"live mask has shape {arr.shape}, expected ({layout.groups},)")
        return arr
    ids = arr.astype(np.int64).ravel()
    bad = ids[(ids < 0) | (ids >= layout.groups)]
    if bad.size:
        raise ValueError(f"live group id {int(bad[0])} outside [0, {layout.groups})")
    mask = np.zeros(layout.groups, dtype=bool)
    mask[ids] = True
    return mask


def _computed_at(stacks: np.ndarray, depth: int,
                 computed: Mapping[int, Sequence[int]] | None) -> np.ndarray:
    """(N, r) bool over current positions: has group w already computed stacks[w, p]?"""
    n, r = stacks.shape
    if computed is None:
        return np.broadcast_to(np.arange(r) < depth, (n, r))
    mask = np.zeros((n, r), dtype=bool)
    for w, types in computed.items():
        mask[w] = np.isin(stacks[w], np.asarray(types, dtype=stacks.dtype))
    return mask


def _covered(stacks: np.ndarray, live_ids: np.ndarray, depth: int, n: int) -> bool:
    top = stacks[live_ids, :depth]
    return np.count_nonzero(np.bincount(top.ravel(), minlength=n)) == n


def _first_slots(stacks: np.ndarray, live_ids: np.ndarray, depth: int,
                 comp_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Give each type the best live slot within the top ``depth`` that already holds it.

    Preference: a slot whose group already computed the type, then the shallowest position,
    then the lowest group id; that is each type's cheapest zero-move slot. Types that no such
    slot holds get group and position -1.
    """
    n = stacks.shape[0]
    types = stacks[live_ids, :depth].T.ravel()          # slots, position-major
    pos = np.repeat(np.arange(depth), live_ids.size)
    grp = np.tile(live_ids, depth)
    done = comp_at[grp, pos]
    pref = np.r_[np.flatnonzero(done), np.flatnonzero(~done)]
    t_pref = types[pref]
    order = np.argsort(t_pref, kind="stable")
    t_sorted = t_pref[order]
    first = pref[order[np.flatnonzero(np.r_[True, t_sorted[1:] != t_sorted[:-1]])]]
    w_of = np.full(n, -1, dtype=np.int64)
    p_of = np.full(n, -1, dtype=np.int64)
    w_of[types[first]] = grp[first]
    p_of[types[first]] = pos[first]
    return w_of, p_of


def _repair(layout: Layout, live: np.ndarray, stacks: np.ndarray, depth: int,
            comp_at: np.ndarray, w_of: np.ndarray, p_of: np.ndarray):
    """Place uncovered types on their cheapest edges where that is free to do.

    Covered types keep their cheapest zero-move slot; each uncovered type takes a free slot
    (one no placed type uses) at a host that computed it if any host did. Every placed type
    then sits on its own cheapest edge, so the partial assignment has the least cost for its
    size; when it is complete it meets the lower bound and is optimal. Returns (w_of, p_of,
    complete); unplaced types keep -1.
    """
    uncovered = np.flatnonzero(w_of < 0)
    used = np.zeros((layout.groups, depth), dtype=bool)
    kept = w_of >= 0
    used[w_of[kept], p_of[kept]] = True
    w_of, p_of = w_of.copy(), p_of.copy()
    complete = True
    for u in uncovered:
        hosts = layout.hosts_of[u]
        hosts = hosts[live[hosts]]
        cur = np.argmax(stacks[hosts] == u, axis=1)
        done = comp_at[hosts, cur]
        cands = np.sort(hosts[done] if done.any() else hosts)
        for w in cands:
            free = np.flatnonzero(~used[w])
            if free.size:
                used[w, free[0]] = True
                w_of[u], p_of[u] = w, free[0]
                break
        else:
            complete = False
    return w_of, p_of, complete


def _slot_graph(layout: Layout, live: np.ndarray, live_ids: np.ndarray, depth: int):
    """Edges type -> (live host w, position p < depth) as a CSR biadjacency skeleton.

    Returns (indptr, cols, rows, w, p): edges are grouped by type, so the CSR row pointer
    comes from a count and scipy never has to sort a COO list.
    """
    live_index = np.full(layout.groups, -1, dtype=np.int64)
    live_index[live_ids] = np.arange(live_ids.size)
    host = layout.hosts_of
    t_idx, j_idx = np.nonzero(live[host])             # row-major: grouped by type
    w = np.repeat(host[t_idx, j_idx], depth)
    rows = np.repeat(t_idx, depth)
    pos = np.tile(np.arange(depth), t_idx.size)
    cols = live_index[w] * depth + pos
    indptr = np.r_[0, np.cumsum(np.bincount(rows, minlength=layout.groups))]
    return indptr, cols, rows, w, pos


def _min_cost_completion(layout: Layout, live: np.ndarray, live_ids: np.ndarray,
                         stacks: np.ndarray, depth: int, comp_at: np.ndarray,
                         w_of: np.ndarray, p_of: np.ndarray):
    """Minimum-cost perfect matching at ``depth`` by successive shortest augmenting paths.

    Starts from the partial matching in which every covered type sits on its cheapest
    (zero-move) edge, the minimum cost for its size, with potentials 0 on types and the
    matched edge's cost on slots; then routes each unmatched type along a shortest augmenting
    path of the residual graph. Reduced costs (Johnson potentials) stay non-negative, so each
    path is one C Dijkstra (``scipy.sparse.csgraph.dijkstra``). No augmenting path means no
    perfect matching: ``depth`` is infeasible and None is returned.

    Why not scipy's Hopcroft-Karp / LAPJVsp: in scipy <= 1.17 both run a Hopcroft-Karp whose
    DFS never marks dead ends (scipy#26147), which is exponential on layered graphs; the
    stacked layout near the tight regime (about half the groups dead at depth 2) is one.
    """
    n = layout.groups
    indptr, cols, rows, w, p = _slot_graph(layout, live, live_ids, depth)
    m = live_ids.size * depth
    offsets = np.asarray(layout.offsets)
    j_of = np.searchsorted(offsets, (rows - w) % n)      # original position of type in w
    inv = _position_table(layout, stacks)
    q = inv[w, j_of]                                       # where w holds the type now
    cost = 1.0 + (q != p) * float(n + 1) + ~comp_at[w, q]
    # Edge (t, w, p) sits at indptr[t] + (rank of w among t's live hosts) * depth + p.
    rank = np.cumsum(live[layout.hosts_of], axis=1) - 1

    def edge(t, w_, p_):
        return indptr[t] + rank[t, np.searchsorted(offsets, (t - w_) % n)] * depth + p_

    match_e = np.full(n, -1, dtype=np.int64)      # type -> index of its matched edge
    slot_t = np.full(m, -1, dtype=np.int64)       # slot -> matched type
    kept = np.flatnonzero(w_of >= 0)
    match_e[kept] = edge(kept, w_of[kept], p_of[kept])
    slot_t[cols[match_e[kept]]] = kept
    src_node, sink = n + m, n + m + 1
    pi = np.zeros(n + m + 2)
    pi[n + cols[match_e[kept]]] = cost[match_e[kept]]
    deg = np.diff(indptr)

    while True:
        free_t = np.flatnonzero(match_e < 0)
        if free_t.size == 0:
            break
        matched = match_e[match_e >= 0]
        fwd = np.ones(rows.size, dtype=bool)
        fwd[matched] = False
        # CSR rows in node order: types (their unmatched edges, already grouped by type),
        # then slots (exactly one edge each: back to its type, or on to T when free),
        # then the source (to every unmatched type), then T (none).
        slot_dst = np.where(slot_t >= 0, slot_t, sink)
        slot_w = np.where(slot_t >= 0,
                          -cost[match_e[np.maximum(slot_t, 0)]] + pi[n:n + m]
                          - pi[np.maximum(slot_t, 0)],
                          pi[n:n + m] - pi[sink])
        out_deg = np.concatenate([deg - (match_e >= 0), np.ones(m, dtype=np.int64),
                                  [free_t.size, 0]])
        data = np.concatenate([cost[fwd] + pi[rows[fwd]] - pi[n + cols[fwd]], slot_w,
                               pi[src_node] - pi[free_t]])
        idx = np.concatenate([n + cols[fwd], slot_dst, free_t])
        g = csr_matrix((np.maximum(data, 0.0), idx, np.r_[0, np.cumsum(out_deg)]),
                       shape=(n + m + 2, n + m + 2))
        dist, pred = dijkstra(g, directed=True, indices=src_node, return_predecessors=True)
        if not np.isfinite(dist[sink]):
            return None
        # Walk back S -> u -> slot -> type -> slot ... -> free slot -> T and flip the path:
        # each type on it takes the slot that follows it.
        v = int(pred[sink])
        while v != src_node:
            t = int(pred[v])
            col = v - n
            match_e[t] = edge(t, live_ids[col // depth], col % depth)
            slot_t[col] = t
            v = int(pred[t])
        pi += np.minimum(dist, dist[sink])
        _augment_direct(match_e, slot_t, pi, indptr, rows, cols, cost, n, src_node, sink)
    cols_of = cols[match_e]
    return live_ids[cols_of // depth], cols_of % depth


def _augment_direct(match_e, slot_t, pi, indptr, rows, cols, cost, n, src_node, sink):
    """Within one primal-dual phase, also augment every one-edge path S -> u -> free slot -> T
    whose reduced costs are all zero under the updated potentials (vertex-disjoint, greedy).
    Such paths are shortest too, and flipping zero-reduced-cost edges keeps the potentials
    valid, so this saves a Dijkstra per orphan that has a free cheapest slot."""
    free_t = np.flatnonzero(match_e < 0)
    if free_t.size == 0:
        return
    free_t = free_t[pi[src_node] - pi[free_t] == 0]
    lengths = indptr[free_t + 1] - indptr[free_t]
    if lengths.sum() == 0:
        return
    starts = np.repeat(indptr[free_t], lengths)
    idx = starts + np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    c = cols[idx]
    ok = (slot_t[c] < 0) & (cost[idx] + pi[rows[idx]] - pi[n + c] == 0) & \
        (pi[n + c] - pi[sink] == 0)
    for e in idx[ok]:
        t, col = rows[e], cols[e]
        if match_e[t] < 0 and slot_t[col] < 0:
            match_e[t] = e
            slot_t[col] = t


def _position_table(layout: Layout, stacks: np.ndarray) -> np.ndarray:
    """(N, r): inv[w, j] is the current stack position of the type group w held at original
    position j."""
    n = layout.groups
    orig_j = np.searchsorted(layout.offsets, (stacks - np.arange(n)[:, None]) % n)
    inv = np.empty_like(orig_j)
    np.put_along_axis(inv, orig_j, np.arange(stacks.shape[1])[None, :], axis=1)
    return inv


def _apply(old: np.ndarray, assign_w: np.ndarray, assign_p: np.ndarray, depth: int,
           changed: np.ndarray) -> np.ndarray:
    """Rewrite the stacks of ``changed`` groups: assigned types at their slots, holes and the
    tail filled with the group's remaining types in their old order (so each row stays a
    permutation of the group's own types). Groups without a moved type keep their row as is.
    """
    new = old.copy()
    for w in changed:
        row = [-1] * depth
        for t in np.flatnonzero(assign_w == w):
            row[int(assign_p[t])] = int(t)
        used = set(row)
        rest = iter([int(x) for x in old[w] if int(x) not in used])
        row = [x if x != -1 else next(rest) for x in row]
        row.extend(rest)
        new[w] = row
    return new


def _patch(assign_w: np.ndarray, needs: np.ndarray) -> dict[int, tuple[int, ...]]:
    out: dict[int, list[int]] = {}
    for t in np.flatnonzero(needs):
        out.setdefault(int(assign_w[t]), []).append(int(t))
    return {w: tuple(ts) for w, ts in sorted(out.items())}


def _in_place(stacks: np.ndarray, live_ids: np.ndarray, depth: int, comp_at: np.ndarray,
              phase: str, reason: str) -> Plan:
    w, p = _first_slots(stacks, live_ids, depth, comp_at)
    needs = ~comp_at[w, p]
    return Plan(depth, stacks.copy(), w, p, phase, 0, _patch(w, needs),
                f"{reason}; {live_ids.size}/{stacks.shape[0]} groups live, "
                f"{int(needs.sum())} shard(s) to patch")


def decide(layout: Layout, live: Sequence[int] | np.ndarray, stacks: np.ndarray, depth: int,
           computed: Mapping[int, Sequence[int]] | None = None) -> Decision:
    """Decide how the survivors finish the current step.

    Args:
        layout: the static layout (which group may hold which type).
        live: the live groups, as ids or as an (N,) bool mask.
        stacks: (N, r) current stack orders (each row a permutation of the group's own types).
        depth: the current stack depth S (1 <= S <= r).
        computed: group -> shard types it has already computed in this step. Default: every
            live group computed its top ``depth`` positions.

    Returns:
        A Plan (masked) or a WipeOut (restart needed), each with a one-line reason.

    Raises:
        ValueError: depth outside [1, r] or a live mask of the wrong shape.
    """
    n, r = layout.groups, layout.redundancy
    if not 1 <= depth <= r:
        raise ValueError(f"depth {depth} outside [1, {r}]")
    live = _live_mask(layout, live)
    live_ids = np.flatnonzero(live)
    stacks = np.asarray(stacks)

    lost = np.flatnonzero(~live[layout.hosts_of].any(axis=1))
    if lost.size:
        shown = ", ".join(str(int(t)) for t in lost[:8]) + (" ..." if lost.size > 8 else "")
        return WipeOut(tuple(int(t) for t in lost),
                       f"wipe-out: {lost.size} shard type(s) lost all {r} hosts ({shown}); "
                       f"{live_ids.size}/{n} groups live")

    comp_at = _computed_at(stacks, depth, computed)
    if _covered(stacks, live_ids, depth, n):
        return _in_place(stacks, live_ids, depth, comp_at, FIXED,
                         f"fixed: survivors' top {depth} cover all {n} types")

    # Phase 1: the smallest feasible depth S*. Below ceil(N / live) there are too few slots;
    # a depth whose current top positions cover every type needs no reordering (free).
    # Phase 2 at that depth: the minimum-movement assignment. Where every orphaned type finds
    # a free slot on its cheapest edge the lower bound is met directly; otherwise successive
    # shortest augmenting paths either complete a minimum-cost matching or prove the depth
    # infeasible, and the search moves one level deeper.
    for s in range(max(depth, -(-n // live_ids.size)), r + 1):
        if _covered(stacks, live_ids, s, n):
            return _in_place(stacks, live_ids, s, comp_at, FREE,
                             f"free: depth {depth} -> {s} without reordering")
        w_of, p_of = _first_slots(stacks, live_ids, s, comp_at)
        rep_w, rep_p, complete = _repair(layout, live, stacks, s, comp_at, w_of, p_of)
        if complete:
            return _reordered(stacks, live_ids, depth, s, comp_at, rep_w, rep_p, "at the bound")
        # The search starts again from the covered types alone: their zero-move edges admit
        # simple potentials, which a partial repair (displacing zero-move occupants) breaks.
        full = _min_cost_completion(layout, live, live_ids, stacks, s, comp_at, w_of, p_of)
        if full is not None:
            return _reordered(stacks, live_ids, depth, s, comp_at, *full,
                              "by shortest augmenting paths")
    raise AssertionError("unreachable: with no type wiped out, depth r is feasible")


def _reordered(stacks: np.ndarray, live_ids: np.ndarray, depth: int, s_star: int,
               comp_at: np.ndarray, assign_w: np.ndarray, assign_p: np.ndarray,
               how: str) -> Plan:
    n = stacks.shape[0]
    moved_t = np.flatnonzero(stacks[assign_w, assign_p] != np.arange(n))
    new_stacks = _apply(stacks, assign_w, assign_p, s_star, np.unique(assign_w[moved_t]))
    cur = assign_p.copy()                       # where the assigned group held each type
    for t in moved_t:
        cur[t] = int(np.argmax(stacks[assign_w[t]] == t))
    needs = ~comp_at[assign_w, cur]
    return Plan(s_star, new_stacks, assign_w, assign_p, MCMF, int(moved_t.size),
                _patch(assign_w, needs),
                f"mcmf: depth {depth} -> {s_star}, {moved_t.size} shard(s) moved ({how}); "
                f"{live_ids.size}/{n} groups live, {int(needs.sum())} shard(s) to patch")
