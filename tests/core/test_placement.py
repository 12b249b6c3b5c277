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
