"""RECTLR controller: property tests that drive the real ``decide`` through failure sequences.

Every trajectory starts from the original layout at depth 1, kills random groups in batches,
and feeds each Plan's stacks and depth back in as the next state (as the runtime does), until
a WipeOut. The small-N checks compare against an exhaustive search written here
(a dynamic program over subsets of shard types; no scipy, no code shared with the controller).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unbroken.core.placement import Layout, make_layout, max_redundancy
from unbroken.core.rectlr import FIXED, FREE, MCMF, Plan, WipeOut, decide, initial_stacks

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
BRUTE_MAX_N = 14  # 2^14 subset states: exhaustive search stays in the low milliseconds


# ----------------------------------------------------------------------------------------------
# Scenario generation and the trajectory driver
# ----------------------------------------------------------------------------------------------

@dataclass
class Step:
    live: frozenset[int]           # live groups when decide ran
    stacks: np.ndarray             # stacks passed in
    depth: int                     # depth passed in
    computed: dict[int, tuple[int, ...]] | None
    decision: Plan | WipeOut


# N values at which the largest allowed r steps up (N = 2 * L_r + 1).
_STEP_N = (3, 7, 13, 23, 35, 51, 69)


@st.composite
def scenarios(draw, min_n: int = 3, max_n: int = 40):
    """(N, r, batches of groups to kill, live-as-mask flag).

    Biased towards what exercises the controller: N where a larger r first fits, r at its
    maximum, and mostly one failure per step (so trajectories are long and reach mcmf).
    """
    n = draw(st.one_of(st.integers(min_n, max_n),
                       st.sampled_from([x for x in _STEP_N if min_n <= x <= max_n])))
    r_max = max_redundancy(n)
    r = draw(st.one_of(st.just(r_max), st.integers(1, r_max)))
    order = draw(st.permutations(range(n)))
    sizes = draw(st.lists(st.sampled_from((1, 1, 1, 2, 3)), min_size=n, max_size=n))
    batches, i = [], 0
    for s in sizes:
        if i >= n:
            break
        batches.append(tuple(order[i:i + s]))
        i += s
    as_mask = draw(st.booleans())
    return n, r, batches, as_mask


def _random_computed(rng: random.Random, stacks: np.ndarray, depth: int,
                     live: frozenset[int]) -> dict[int, tuple[int, ...]]:
    """An explicit ``computed`` mapping: most live groups got partway down their top ``depth``,
    some computed an arbitrary subset of their types, some nothing; a dead group may appear."""
    out: dict[int, tuple[int, ...]] = {}
    for w in range(stacks.shape[0]):
        roll = rng.random()
        row = [int(x) for x in stacks[w]]
        if w not in live and roll < 0.8:
            continue
        if roll < 0.5:
            out[w] = tuple(row[:rng.randint(0, depth)])
        elif roll < 0.8:
            out[w] = tuple(t for t in row if rng.random() < 0.5)
        # else: absent, i.e. nothing computed
    return out


def walk(layout: Layout, batches: Sequence[Sequence[int]], as_mask: bool,
         rng: random.Random | None = None) -> list[Step]:
    """Drive ``decide`` through the batches; stop after the first WipeOut."""
    n = layout.groups
    live = set(range(n))
    stacks, depth = initial_stacks(layout), 1
    steps: list[Step] = []
    for batch in batches:
        live -= set(batch)
        frozen = frozenset(live)
        if as_mask:
            arg = np.zeros(n, dtype=bool)
            arg[list(live)] = True
        else:
            arg = sorted(live)
        computed = _random_computed(rng, stacks, depth, frozen) if rng is not None else None
        before = stacks.copy()
        dec = decide(layout, arg, stacks, depth, computed)
        assert np.array_equal(stacks, before), "decide mutated the stacks it was given"
        steps.append(Step(frozen, before, depth, computed, dec))
        if isinstance(dec, WipeOut):
            break
        stacks, depth = dec.stacks, dec.depth
    return steps


def lost_types(layout: Layout, live: frozenset[int]) -> tuple[int, ...]:
    return tuple(t for t in range(layout.groups)
                 if not any(int(w) in live for w in layout.hosts(t)))


# ----------------------------------------------------------------------------------------------
# Exhaustive reference: dynamic program over subsets of types
# ----------------------------------------------------------------------------------------------

def brute_min_cost(layout: Layout, live: frozenset[int], stacks: np.ndarray, d: int,
                   computed: Mapping[int, Sequence[int]] | None, old_depth: int):
    """Exact minimum over all perfect assignments of types to (live host, position < d) slots.

    Returns (moves, recomputes) for the lexicographically smallest assignment, or None when no
    perfect assignment exists. A type "moves" when the slot's current occupant is another type;
    it is "recomputed" when its group has not computed it (default: not in the group's top
    ``old_depth``). Slots are processed one by one; each either stays empty or takes one of its
    group's own types not taken yet, so every injective assignment is enumerated.
    """
    n = layout.groups
    assert n <= BRUTE_MAX_N
    big = n + 1
    full = (1 << n) - 1
    masks = np.arange(1 << n, dtype=np.int64)
    free_of = [masks[(masks >> t) & 1 == 0] for t in range(n)]
    inf = np.iinfo(np.int64).max // 4
    f = np.full(1 << n, inf, dtype=np.int64)
    f[0] = 0
    for w in sorted(live):
        if computed is None:
            done = {int(x) for x in stacks[w, :old_depth]}
        else:
            done = {int(x) for x in computed.get(w, ())}
        own = [int(x) for x in layout.stacks[w]]
        for p in range(d):
            g = f.copy()
            for t in own:
                cost = (big if int(stacks[w, p]) != t else 0) + (0 if t in done else 1)
                src = free_of[t]
                dst = src | (1 << t)
                g[dst] = np.minimum(g[dst], f[src] + cost)
            f = g
    best = int(f[full])
    if best >= inf:
        return None
    return divmod(best, big)


def plan_cost(step: Step, plan: Plan) -> tuple[int, int]:
    """(moves, recomputes) of the plan's own assignment, measured against the old state."""
    n = plan.assignment.shape[0]
    moves = sum(int(step.stacks[plan.assignment[t], plan.position[t]]) != t for t in range(n))
    redo = sum(not _was_computed(step, int(plan.assignment[t]), t) for t in range(n))
    return moves, redo


def _was_computed(step: Step, w: int, t: int) -> bool:
    if step.computed is None:
        return t in {int(x) for x in step.stacks[w, :step.depth]}
    return t in set(step.computed.get(w, ()))


# ----------------------------------------------------------------------------------------------
# Invariant checks shared by the property tests
# ----------------------------------------------------------------------------------------------

def check_cover(layout: Layout, step: Step, plan: Plan) -> None:
    n, r = layout.groups, layout.redundancy
    a, p = plan.assignment, plan.position
    assert a.shape == (n,) and p.shape == (n,)
    assert plan.stacks.shape == (n, r)
    for t in range(n):
        w = int(a[t])
        assert w in step.live, f"type {t} assigned to dead group {w}"
        assert 0 <= int(p[t]) < plan.depth
        assert int(plan.stacks[w, p[t]]) == t
    slots = {(int(a[t]), int(p[t])) for t in range(n)}
    assert len(slots) == n, "two types share one slot"
    contrib = plan.contributions()
    assert sorted(t for ts in contrib.values() for t in ts) == list(range(n))


def check_rows(layout: Layout, stacks: np.ndarray) -> None:
    for w in range(layout.groups):
        assert sorted(int(x) for x in stacks[w]) == sorted(layout.stack(w)), f"row {w} broken"


# ----------------------------------------------------------------------------------------------
# Property tests
# ----------------------------------------------------------------------------------------------

@settings(max_examples=100, **SETTINGS)
@given(scenarios())
def test_plan_covers_every_type_once(sc):
    n, r, batches, as_mask = sc
    layout = make_layout(n, r)
    for step in walk(layout, batches, as_mask):
        if isinstance(step.decision, Plan):
            check_cover(layout, step, step.decision)


@settings(max_examples=100, **SETTINGS)
@given(scenarios())
def test_depth_phase_and_rows(sc):
    n, r, batches, as_mask = sc
    layout = make_layout(n, r)
    check_rows(layout, initial_stacks(layout))
    for step in walk(layout, batches, as_mask):
        plan = step.decision
        if isinstance(plan, WipeOut):
            continue
        assert step.depth <= plan.depth <= r
        assert plan.phase in (FIXED, FREE, MCMF)
        live = sorted(step.live)
        covered_now = set(step.stacks[live, :step.depth].ravel().tolist()) == set(range(n))
        assert (plan.phase == FIXED) == covered_now
        if plan.phase == FIXED:
            assert plan.depth == step.depth
        if plan.phase in (FIXED, FREE):
            assert np.array_equal(plan.stacks, step.stacks)
            assert plan.moved == 0
        else:
            assert plan.moved >= 1
        assert plan.moved == sum(
            int(step.stacks[plan.assignment[t], plan.position[t]]) != t for t in range(n))
        # Dead groups keep their rows; every row stays a permutation of its own types.
        for w in set(range(n)) - step.live:
            assert np.array_equal(plan.stacks[w], step.stacks[w])
        check_rows(layout, plan.stacks)
        # Types a group does not contribute keep their old relative order in its row.
        for w in step.live:
            mine = {t for t in range(n) if int(plan.assignment[t]) == w}
            assert ([int(x) for x in plan.stacks[w] if int(x) not in mine]
                    == [int(x) for x in step.stacks[w] if int(x) not in mine])
        assert isinstance(plan.reason, str) and plan.reason.startswith(plan.phase)


@settings(max_examples=100, **SETTINGS)
@given(scenarios())
def test_wipeout_iff_a_type_lost_all_hosts(sc):
    n, r, batches, as_mask = sc
    layout = make_layout(n, r)
    steps = walk(layout, batches, as_mask)
    for step in steps:
        lost = lost_types(layout, step.live)
        if isinstance(step.decision, WipeOut):
            assert lost, "wipe-out although every type kept a live host"
            assert step.decision.lost_types == lost
            assert step.decision.reason.startswith("wipe-out")
        else:
            assert not lost, f"plan although types {lost} lost every host"
    # Everything gets killed eventually, so every trajectory ends in a wipe-out.
    assert isinstance(steps[-1].decision, WipeOut)


@settings(max_examples=150, **SETTINGS)
@given(scenarios(max_n=BRUTE_MAX_N))
def test_depth_is_minimal_brute_force(sc):
    n, r, batches, as_mask = sc
    layout = make_layout(n, r)
    for step in walk(layout, batches, as_mask):
        plan = step.decision
        if isinstance(plan, WipeOut):
            # No depth up to r admits a cover.
            assert brute_min_cost(layout, step.live, step.stacks, r, None, step.depth) is None
            continue
        for d in range(step.depth, plan.depth):
            got = brute_min_cost(layout, step.live, step.stacks, d, None, step.depth)
            assert got is None, f"depth {d} < {plan.depth} admits a cover"
        assert brute_min_cost(layout, step.live, step.stacks, plan.depth, None,
                              step.depth) is not None


@settings(max_examples=150, **SETTINGS)
@given(scenarios(max_n=BRUTE_MAX_N), st.randoms(use_true_random=False), st.booleans())
def test_mcmf_moves_are_minimal_brute_force(sc, rng, explicit):
    n, r, batches, as_mask = sc
    layout = make_layout(n, r)
    for step in walk(layout, batches, as_mask, rng if explicit else None):
        plan = step.decision
        if isinstance(plan, WipeOut):
            continue
        best = brute_min_cost(layout, step.live, step.stacks, plan.depth, step.computed,
                              step.depth)
        assert best is not None
        assert plan.moved == best[0], f"{plan.phase}: moved {plan.moved}, minimum {best[0]}"
        # The documented tie-break: among minimum-movement plans, fewest recomputes.
        assert plan_cost(step, plan) == best


@settings(max_examples=100, **SETTINGS)
@given(scenarios(), st.randoms(use_true_random=False), st.booleans())
def test_patch_lists_exactly_the_uncomputed_types(sc, rng, explicit):
    n, r, batches, as_mask = sc
    layout = make_layout(n, r)
    for step in walk(layout, batches, as_mask, rng if explicit else None):
        plan = step.decision
        if isinstance(plan, WipeOut):
            continue
        patched = [(w, t) for w, ts in plan.patch.items() for t in ts]
        assert len(patched) == len(set(t for _, t in patched)), "type patched twice"
        for w, t in patched:
            assert int(plan.assignment[t]) == w
        want = {t for t in range(n) if not _was_computed(step, int(plan.assignment[t]), t)}
        assert {t for _, t in patched} == want
        assert all(ts for ts in plan.patch.values()), "empty patch entry"


@settings(max_examples=40, **SETTINGS)
@given(scenarios(max_n=30))
def test_ids_and_mask_give_the_same_plan(sc):
    n, r, batches, _ = sc
    layout = make_layout(n, r)
    for step in walk(layout, batches, as_mask=False):
        mask = np.zeros(n, dtype=bool)
        mask[list(step.live)] = True
        other = decide(layout, mask, step.stacks, step.depth)
        a, b = step.decision, other
        assert type(a) is type(b)
        if isinstance(a, WipeOut):
            assert a.lost_types == b.lost_types
        else:
            assert (a.depth, a.phase, a.moved, a.patch) == (b.depth, b.phase, b.moved, b.patch)
            assert np.array_equal(a.stacks, b.stacks)
            assert np.array_equal(a.assignment, b.assignment)
            assert np.array_equal(a.position, b.position)


# ----------------------------------------------------------------------------------------------
# Brute-force reference sanity (so a broken reference cannot pass everything vacuously)
# ----------------------------------------------------------------------------------------------

def test_brute_force_reference_on_hand_cases():
    layout = make_layout(7, 3)      # offsets 0, 1, 3
    stacks = initial_stacks(layout)
    everyone = frozenset(range(7))
    assert brute_min_cost(layout, everyone, stacks, 1, None, 1) == (0, 0)
    # Group 0 dead: depth 1 has 6 slots for 7 types; depth 2 works in place with one patch.
    live = everyone - {0}
    assert brute_min_cost(layout, live, stacks, 1, None, 1) is None
    assert brute_min_cost(layout, live, stacks, 2, None, 1) == (0, 1)
    # All three hosts of type 0 (groups 0, 6, 4) dead: nothing works.
    live = everyone - {0, 6, 4}
    assert brute_min_cost(layout, live, stacks, 3, None, 1) is None


# ----------------------------------------------------------------------------------------------
# Deterministic cases
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,r", [(3, 2), (7, 3), (13, 4), (40, 6), (200, 12), (600, 8)])
def test_first_failure_goes_to_depth_two_with_one_patch(n, r):
    layout = make_layout(n, r)
    for dead in (0, n // 2, n - 1):
        live = [w for w in range(n) if w != dead]
        plan = decide(layout, live, initial_stacks(layout), 1)
        assert isinstance(plan, Plan)
        assert plan.depth == 2
        assert plan.phase in (FREE, MCMF)
        patched = [t for ts in plan.patch.values() for t in ts]
        assert patched == [dead]  # the dead group's top type
        host = int(plan.assignment[dead])
        assert host != dead and dead in layout.stack(host)


def test_first_failure_at_r1_is_a_wipeout():
    layout = make_layout(5, 1)
    dec = decide(layout, [0, 1, 3, 4], initial_stacks(layout), 1)
    assert isinstance(dec, WipeOut) and dec.lost_types == (2,)


@pytest.mark.parametrize("n,r", [(3, 2), (13, 4), (69, 8), (600, 20)])
def test_all_hosts_of_type_zero_dead_is_a_wipeout(n, r):
    layout = make_layout(n, r)
    dead = set(layout.hosts(0))
    live = [w for w in range(n) if w not in dead]
    for depth in range(1, r + 1):
        dec = decide(layout, live, initial_stacks(layout), depth)
        assert isinstance(dec, WipeOut)
        assert 0 in dec.lost_types
        assert dec.lost_types == lost_types(layout, frozenset(live))


@pytest.mark.parametrize("n,r", [(1, 1), (3, 2), (13, 4), (600, 20)])
def test_healthy_layout_is_fixed_identity(n, r):
    layout = make_layout(n, r)
    for depth in (1, r):
        plan = decide(layout, list(range(n)), initial_stacks(layout), depth)
        assert isinstance(plan, Plan)
        assert plan.phase == FIXED and plan.depth == depth and plan.moved == 0
        assert np.array_equal(plan.assignment, np.arange(n))
        assert np.array_equal(plan.position, np.zeros(n))
        assert plan.patch == {}
        assert np.array_equal(plan.stacks, layout.stacks)


def test_explicit_computed_patches_what_was_not_computed():
    layout = make_layout(7, 3)
    stacks = initial_stacks(layout)
    # Nobody dead, depth 1, but groups 2 and 5 had not finished their top shard.
    computed = {w: (w,) for w in range(7) if w not in (2, 5)}
    plan = decide(layout, list(range(7)), stacks, 1, computed)
    assert plan.phase == FIXED
    assert plan.patch == {2: (2,), 5: (5,)}
    # An explicit computed mapping equal to the default gives the default plan.
    default = decide(layout, [w for w in range(7) if w != 3], stacks, 1)
    same = decide(layout, [w for w in range(7) if w != 3], stacks, 1,
                  {w: (w,) for w in range(7) if w != 3})
    assert default.patch == same.patch and default.depth == same.depth


def test_plan_stacks_are_fresh_arrays():
    layout = make_layout(13, 4)
    stacks = initial_stacks(layout)
    plan = decide(layout, list(range(1, 13)), stacks, 1)
    assert plan.stacks is not stacks
    plan.stacks[0, 0] = plan.stacks[0, 0]  # writable


@pytest.mark.parametrize("depth", [0, -1, 5, 9])
def test_depth_out_of_range_raises(depth):
    layout = make_layout(13, 4)
    with pytest.raises(ValueError, match="depth"):
        decide(layout, list(range(13)), initial_stacks(layout), depth)


def test_wrong_mask_shape_raises():
    layout = make_layout(13, 4)
    with pytest.raises(ValueError):
        decide(layout, np.ones(12, dtype=bool), initial_stacks(layout), 1)


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_layouts(n):
    layout = make_layout(n, 1)
    plan = decide(layout, list(range(n)), initial_stacks(layout), 1)
    assert isinstance(plan, Plan) and plan.phase == FIXED
    dec = decide(layout, np.zeros(n, dtype=bool), initial_stacks(layout), 1)
    assert isinstance(dec, WipeOut) and dec.lost_types == tuple(range(n))
    dec = decide(layout, [], initial_stacks(layout), 1)
    assert isinstance(dec, WipeOut) and dec.lost_types == tuple(range(n))


def test_live_ids_outside_the_layout_are_rejected():
    layout = make_layout(7, 3)
    stacks = initial_stacks(layout)
    with pytest.raises(ValueError, match="-1"):
        decide(layout, [0, 1, -1], stacks, 1)
    with pytest.raises(ValueError, match="7"):
        decide(layout, [0, 7], stacks, 1)


@pytest.mark.parametrize("n,r,seed", [(200, 4, 0), (600, 8, 1), (97, 3, 2)])
def test_top_cover_answers_phase_zero_exactly_as_decide_does(n, r, seed):
    """The incremental phase-0 count says 'fixed' exactly when decide does, batch after
    batch of failures until the wipe-out, and then decide's plan changes nothing."""
    from unbroken.core.rectlr import FIXED, TopCover

    layout = make_layout(n, r)
    rng = np.random.default_rng(seed)
    live = np.ones(n, dtype=bool)
    stacks, depth = initial_stacks(layout), 1
    cover = TopCover(stacks, live, depth)
    order = list(rng.permutation(n))
    fixed_seen = other_seen = 0
    while order:
        batch = [int(order.pop()) for _ in range(min(len(order), int(rng.integers(1, 4))))]
        says_fixed = cover.survives(batch)
        live[batch] = False
        d = decide(layout, live, stacks, depth)
        if not isinstance(d, Plan):
            assert not says_fixed
            break
        assert says_fixed == (d.phase == FIXED)
        if says_fixed:
            fixed_seen += 1
            assert d.depth == depth and np.array_equal(d.stacks, stacks)
            cover.remove(batch)
        else:
            other_seen += 1
            stacks, depth = d.stacks, d.depth
            cover = TopCover(stacks, live, depth)
    assert fixed_seen > 0 and other_seen > 0
