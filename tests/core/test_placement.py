"""Golomb-ruler stacked placement: ruler table, independence condition, limits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from unbroken.core import placement
from unbroken.core.placement import (
    GOLOMB_RULERS,
    MAX_REDUNDANCY,
    PlacementError,
    check,
    make_layout,
    max_redundancy,
    min_groups,
)

# Lengths of the optimal Golomb rulers of order 1..27 (OEIS A003022, with order 1 -> 0).
OPTIMAL_LENGTHS = (0, 1, 3, 6, 11, 17, 25, 34, 44, 55, 72, 85, 106, 127, 151, 177, 199, 216,
                   246, 283, 333, 356, 372, 425, 480, 492, 553)

# (N, r) pairs covering small, boundary (N == 2L+1) and paper-sized layouts.
LAYOUTS = [(1, 1), (2, 1), (3, 2), (7, 3), (12, 3), (13, 4), (23, 5), (40, 6), (69, 8),
           (200, 12), (567, 20), (600, 8), (1000, 26)]


def test_table_has_orders_1_to_27():
    assert MAX_REDUNDANCY == 27
    assert len(GOLOMB_RULERS) == 27
    for r, marks in enumerate(GOLOMB_RULERS, start=1):
        assert len(marks) == r
        assert marks[0] == 0
        assert list(marks) == sorted(set(marks)), f"order {r}: marks not strictly increasing"


@pytest.mark.parametrize("r", range(1, 28))
def test_rows_are_golomb_rulers(r):
    marks = GOLOMB_RULERS[r - 1]
    diffs = [b - a for a, b in itertools.combinations(marks, 2)]
    assert len(diffs) == len(set(diffs)), f"order {r}: repeated difference"


@pytest.mark.parametrize("r", range(1, 28))
def test_rows_have_optimal_length(r):
    assert GOLOMB_RULERS[r - 1][-1] == OPTIMAL_LENGTHS[r - 1]


@pytest.mark.parametrize("r,length", [(4, 6), (8, 34), (20, 283)])
def test_known_lengths(r, length):
    assert GOLOMB_RULERS[r - 1][-1] == length
    assert min_groups(r) == 2 * length + 1


@pytest.mark.parametrize("n,r", LAYOUTS)
def test_two_types_share_at_most_one_group(n, r):
    lay = make_layout(n, r)
    # Count, for every pair of types, the groups that hold both.
    share = np.zeros((n, n), dtype=np.int64)
    for w in range(n):
        row = lay.stacks[w]
        share[np.ix_(row, row)] += 1
    np.fill_diagonal(share, 0)
    assert share.max(initial=0) <= 1


@pytest.mark.parametrize("n,r", LAYOUTS)
def test_stack_and_hosts_agree(n, r):
    lay = make_layout(n, r)
    assert lay.stacks.shape == (n, r)
    assert lay.hosts_of.shape == (n, r)
    holds = {(w, t) for w in range(n) for t in lay.stack(w)}
    hosted = {(w, t) for t in range(n) for w in lay.hosts(t)}
    assert holds == hosted
    for w in range(n):
        st = lay.stack(w)
        assert len(set(st)) == r, f"group {w} holds a repeated type"
        assert all(0 <= t < n for t in st)
        assert st[0] == w  # offset 0 puts a group's own type on top
    for t in range(n):
        hs = lay.hosts(t)
        assert len(set(hs)) == r, f"type {t} has a repeated host"
        # hosts(t)[j] holds t at original position j
        for j, w in enumerate(hs):
            assert lay.stack(w)[j] == t


@pytest.mark.parametrize("n,r", LAYOUTS)
def test_layout_arrays_are_read_only(n, r):
    lay = make_layout(n, r)
    with pytest.raises(ValueError):
        lay.stacks[0, 0] = 0
    with pytest.raises(ValueError):
        lay.hosts_of[0, 0] = 0


def test_max_redundancy_matches_bound():
    for n in list(range(1, 60)) + [200, 600, 1000, 10000]:
        r = max_redundancy(n)
        assert r >= 1
        check(n, r)
        if r < MAX_REDUNDANCY:
            with pytest.raises(PlacementError):
                check(n, r + 1)
    # The authors' sweep limits: r <= 12 at N=200, r <= 20 at N=600, r <= 26 at N=1000.
    assert (max_redundancy(200), max_redundancy(600), max_redundancy(1000)) == (12, 20, 26)
    assert max_redundancy(0) == 0


def test_too_few_groups_names_the_bound():
    with pytest.raises(PlacementError) as exc:
        make_layout(200, 13)
    msg = str(exc.value)
    assert "200" in msg
    assert "2*L+1" in msg
    assert str(min_groups(13)) in msg  # 2 * 106 + 1 = 213
    assert min_groups(13) == 213


def test_boundary_n_is_accepted():
    for r in (2, 5, 13):
        n = min_groups(r)
        make_layout(n, r)
        with pytest.raises(PlacementError, match=r"2\*L\+1"):
            make_layout(n - 1, r)


@pytest.mark.parametrize("n,r,needles", [
    (100000, 28, ("28", "27")),                    # beyond the ruler table
    (100000, 40, ("40", "27")),
    (1, 2, ("2", "1", "exceeds the number of groups")),   # r > N
    (2, 3, ("3", "2", "exceeds the number of groups")),
    (10, 0, ("redundancy", "0")),                  # r < 1
    (10, -1, ("redundancy", "-1")),
    (0, 1, ("groups", "0")),                       # N < 1
    (-5, 3, ("groups", "-5")),
])
def test_limits_raise_placement_error(n, r, needles):
    for fn in (check, make_layout):
        with pytest.raises(PlacementError) as exc:
            fn(n, r)
        for needle in needles:
            assert needle in str(exc.value)


def test_placement_error_is_value_error():
    assert issubclass(PlacementError, ValueError)
    assert placement.PlacementError is PlacementError


def test_a_wipe_out_names_the_last_holder_of_every_slot_without_a_live_one():
    # 5 slots; slot 3 was refilled by uid 7; the lost member is uid 7 (slot 3), and slot 1 lost
    # its holder earlier without a replacement: the answer must refill both slots
    holder = {0: 0, 1: 1, 2: 2, 3: 7, 4: 4}
    gone, why = placement.wiped_out(holder, held={0, 2, 4}, lost=7)
    assert gone == (1, 7)
    assert why == "wipe-out: slots [1, 3] have no live holder"
    # every slot still held by someone else: only the lost one is named
    gone, why = placement.wiped_out(holder, held={0, 1, 2, 4}, lost=7)
    assert gone == (7,) and "[3]" in why
    # the lost member is named even when its slot already has a newer holder
    gone, _ = placement.wiped_out({0: 5, 1: 1}, held={0}, lost=0)
    assert gone == (0, 1)
    # nobody left: every slot's last holder
    assert placement.wiped_out({0: 3, 1: 4}, held=(), lost=4)[0] == (3, 4)


# ---- node-aware placement ------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from unbroken.core.placement import (  # noqa: E402
    check_nodes,
    conflicts,
    node_loss_safe,
    node_placement,
    nodes_needed,
)


def _brute_safe(lay, node_of):
    """Safe by definition: every node's loss leaves each type with r - 1 hosts or more."""
    for k in set(node_of):
        for t in range(lay.groups):
            if sum(node_of[h] == k for h in lay.hosts(t)) > 1:
                return False
    return True


def _balanced(node_of, nodes):
    sizes = [list(node_of).count(k) for k in range(nodes)]
    return max(sizes) - min(sizes) <= 1 and set(node_of) <= set(range(nodes))


def _brute_needed(lay):
    """The fewest nodes with a balanced safe placement, by trying every assignment (tiny N)."""
    n = lay.groups
    for k in range(1, n + 1):
        for node_of in itertools.product(range(k), repeat=n):
            if node_of[0] == 0 and _balanced(node_of, k) and _brute_safe(lay, node_of):
                return k
    return None


SMALL = [(3, 2), (4, 2), (5, 2), (6, 2), (7, 2), (8, 2), (8, 3)]


@pytest.mark.parametrize("n,r", SMALL)
def test_nodes_needed_is_the_brute_force_minimum(n, r):
    lay = make_layout(n, r)
    need, why = nodes_needed(lay)
    assert need == _brute_needed(lay)
    assert "minimum" in why
    assert node_placement(lay, need).safe
    for k in range(1, need):
        p = node_placement(lay, k)
        assert not p.safe and p.proved


def test_the_checker_agrees_with_brute_force_on_every_small_placement():
    for n, r in [(4, 2), (5, 2), (7, 3)]:
        lay = make_layout(n, r)
        for node_of in itertools.product(range(3), repeat=n):
            ok, why = node_loss_safe(lay, node_of)
            assert ok == _brute_safe(lay, node_of), (n, r, node_of)
            assert ok == (not conflicts(lay, node_of))
            assert why.startswith("safe" if ok else "unsafe")


def test_the_checker_names_the_conflict_and_a_wipe_out():
    lay = make_layout(8, 2)   # group w holds types w, w+1: neighbours share a type
    ok, why = node_loss_safe(lay, (0, 0, 1, 1, 2, 2, 3, 3))
    assert not ok
    assert why.startswith("unsafe: node 0 holds groups 0 and 1, which share shard type 1")
    assert "2 of that type's 2 hosts (a wipe-out)" in why
    assert node_loss_safe(lay, (0, 1) * 4) == (True, node_loss_safe(lay, (1, 0) * 4)[1])
    ok, why = node_loss_safe(make_layout(5, 1), (0, 1, 2, 3, 4))
    assert not ok and "redundancy 1" in why
    with pytest.raises(ValueError, match="3 entries for 8 groups"):
        node_loss_safe(lay, (0, 1, 2))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.integers(3, 48), st.integers(2, 5), st.data())
def test_a_placement_is_balanced_and_safe_exactly_when_it_says(n, r, data):
    if n < min_groups(r):
        r = max_redundancy(n)
    lay = make_layout(n, r)
    k = data.draw(st.integers(1, n))
    p = node_placement(lay, k, budget=2_000)
    assert len(p.node_of) == n and _balanced(p.node_of, k)
    assert p.safe == _brute_safe(lay, p.node_of) == (not p.conflicts)
    assert p.conflicts == conflicts(lay, p.node_of)
    assert node_loss_safe(lay, p.node_of)[0] == p.safe
    if p.safe:
        assert p.proved
    assert node_placement(lay, k, budget=2_000) == p  # deterministic


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.integers(3, 400), st.integers(2, 8), st.integers(1, 400), st.integers(1, 200))
def test_the_ring_construction_is_safe_exactly_when_its_condition_holds(n, r, k, c):
    """node = (c*w mod N) mod K is conflict-free iff K divides no e = c*d mod N nor N - e."""
    if n < min_groups(r):
        return
    k, c = min(k, n), c % n or 1
    if np.gcd(c, n) != 1:
        return
    lay = make_layout(n, r)
    node_of = [(c * w % n) % k for w in range(n)]
    es = [c * d % n for d in placement.differences(lay)]
    claim = all(e % k and (n - e) % k for e in es)
    assert claim == (not conflicts(lay, node_of))
    assert _balanced(node_of, k)


# N, r -> fewest nodes (docs/nodes.md's table); every entry a proved minimum
NEEDED = {(4, 2): 2, (8, 2): 2, (16, 2): 2, (32, 2): 2, (8, 3): 4, (16, 3): 4, (32, 3): 4,
          (16, 4): 8, (32, 4): 8, (32, 5): 8, (7, 2): 3, (7, 3): 7, (13, 4): 13}


@pytest.mark.parametrize("n,r", sorted(NEEDED))
def test_the_docs_table(n, r):
    need, why = nodes_needed(make_layout(n, r))
    assert need == NEEDED[(n, r)] and "minimum" in why


def test_balanced_placements_are_not_monotone_in_the_node_count():
    # 24 groups, r = 5: 6 nodes of 4 (the residues mod 6) are safe; 7 nodes are not (a node
    # of 4 must then be a residue class mod 6, and what is left cannot be split): documented
    lay = make_layout(24, 5)
    assert nodes_needed(lay)[0] == 6
    p = node_placement(lay, 7)
    assert not p.safe and p.proved


def test_large_layouts_answer_with_an_honest_upper_bound():
    lay = make_layout(600, 8)
    need, why = nodes_needed(lay)
    assert node_placement(lay, need).safe
    assert need >= 16  # 1..15 are all differences of the order-8 ruler: a clique of 16
    assert "upper bound" in why or "minimum" in why


def test_redundancy_one_is_never_safe():
    lay = make_layout(6, 1)
    assert nodes_needed(lay)[0] is None
    p = node_placement(lay, 6)
    assert not p.safe and "redundancy 1" in p.reason


@pytest.mark.parametrize("nodes,needle", [(0, "got 0"), (-3, "got -3"), (9, "nodes 9 exceeds")])
def test_bad_node_counts_raise_one_line_naming_the_value(nodes, needle):
    for call in (lambda: check_nodes(8, nodes), lambda: node_placement(make_layout(8, 2), nodes)):
        with pytest.raises(ValueError) as exc:
            call()
        assert needle in str(exc.value) and "\n" not in str(exc.value)
