"""Dual-phase replay localises a planted culprit; the redundant SDC check picks real hosts."""

import math

import numpy as np
import pytest

from unbroken.core.placement import make_layout
from unbroken.core.replay import (
    ReplayError,
    ReplayLayout,
    Round,
    Verdict,
    feasible_k,
    next_round,
    redundant_check_pairs,
    rounds_promised,
)


def run_replay(layout, culprits):
    """Drive the planner with an oracle: a group mismatches iff it holds a culprit."""
    results, rounds = [], 0
    while True:
        step, reason = next_round(layout, results)
        assert reason
        if isinstance(step, Verdict):
            return step, rounds
        rounds += 1
        # every round uses each machine exactly once
        assert sorted(i for s in step.subsets for i in s) == list(range(layout.machines))
        assert all(len(s) == layout.size for s in step.subsets)
        results.append([any(c in s for c in culprits) for s in step.subsets])


@pytest.mark.parametrize("pp, dp, k", [(1, 2, 1), (2, 4, 1), (2, 8, 2), (4, 4, 1), (3, 12, 2),
                                       (1, 16, 4)])
def test_finds_every_single_culprit_within_two_rounds(pp, dp, k):
    layout = ReplayLayout(pp, dp, k)
    for c in range(layout.machines):
        verdict, rounds = run_replay(layout, [c])
        assert verdict.culprits == (c,) and verdict.exact
        assert rounds == rounds_promised() == 2


def test_several_culprits_are_all_among_the_suspects():
    layout = ReplayLayout(2, 8, 1)
    # 0 in H0 = {0, 1}, V0 = {0, 8}; 9 in H4 = {8, 9}, V1 = {1, 9}: the crossings hold 1 and 8
    verdict, rounds = run_replay(layout, [0, 9])
    assert verdict.culprits == (0, 1, 8, 9) and rounds == 2
    assert not verdict.exact  # four intersections, two of them innocent
    verdict, _ = run_replay(layout, [0, 11])  # crossings empty: still exact
    assert verdict.culprits == (0, 11) and verdict.exact
    verdict, _ = run_replay(layout, [2, 3])  # same contiguous group: still exact
    assert verdict.culprits == (2, 3) and verdict.exact


def test_no_reproduction_ends_after_one_round():
    verdict, rounds = run_replay(ReplayLayout(2, 4), [])
    assert verdict.culprits == () and rounds == 1


def test_phase_two_not_reproducing_suspects_the_failed_block():
    layout = ReplayLayout(2, 4)
    first, _ = next_round(layout)
    second, _ = next_round(layout, [[False, True, False, False]])
    assert isinstance(second, Round) and second.phase == "vertical"
    verdict, reason = next_round(layout, [[False, True, False, False], [False] * 4])
    assert verdict.culprits == first.subsets[1] and not verdict.exact and "did not reproduce" in reason


def test_layout_and_results_are_validated():
    assert feasible_k(2, 8) == [1, 2]
    with pytest.raises(ReplayError, match="dp must be >= pp"):
        ReplayLayout(4, 2)
    with pytest.raises(ReplayError, match="k=3"):
        ReplayLayout(1, 8, 3)
    with pytest.raises(ReplayError, match="3 results"):
        next_round(ReplayLayout(2, 4), [[True, False, False]])
    with pytest.raises(ReplayError, match="three|3 rounds"):
        next_round(ReplayLayout(2, 4), [[True] * 4] * 3)


def _holds(stacks, w, t):
    return t in stacks[w]


@pytest.mark.parametrize("n, r, k", [(7, 3, 1), (12, 3, 2), (24, 4, 5)])
def test_redundant_pairs_hold_the_type_and_cover_all_types(n, r, k):
    stacks = make_layout(n, r).stacks
    seen = set()
    for step in range(math.ceil(n / k)):
        pairs = redundant_check_pairs(stacks, step, seed=3, k=k)
        assert len(pairs) == k
        for t, a, b in pairs:
            assert a != b and _holds(stacks, a, t) and _holds(stacks, b, t)
            assert stacks[a][0] == t  # host a computes it anyway (top of its stack)
            seen.add(t)
    assert seen == set(range(n))


def test_redundant_pairs_are_deterministic_per_seed_and_respect_liveness():
    stacks = make_layout(12, 3).stacks
    a = [redundant_check_pairs(stacks, s, seed=1, k=3) for s in range(8)]
    assert a == [redundant_check_pairs(stacks, s, seed=1, k=3) for s in range(8)]
    assert a != [redundant_check_pairs(stacks, s, seed=2, k=3) for s in range(8)]
    live = np.ones(12, dtype=bool)
    live[[0, 5]] = False
    for s in range(12):
        for t, x, y in redundant_check_pairs(stacks, s, seed=1, k=2, live=live):
            assert live[x] and live[y] and _holds(stacks, x, t) and _holds(stacks, y, t)


def test_redundant_pairs_refuse_bad_input():
    stacks = make_layout(7, 3).stacks
    with pytest.raises(ReplayError, match="r=1"):
        redundant_check_pairs(stacks[:, :1], 0, 0)
    with pytest.raises(ReplayError, match="k=8"):
        redundant_check_pairs(stacks, 0, 0, k=8)
    with pytest.raises(ReplayError, match="step=-1"):
        redundant_check_pairs(stacks, -1, 0)
    with pytest.raises(ReplayError, match="shape"):
        redundant_check_pairs(np.arange(5), 0, 0)


def test_digest_mismatches_keeps_only_disagreeing_types():
    from unbroken.core.replay import digest_mismatches

    d = {0: {0: 5, 1: 5}, 1: {1: 7, 2: 8}, 2: {2: 9}, 3: {}}
    assert digest_mismatches(d) == {1: {1: 7, 2: 8}}
    assert digest_mismatches({0: {0: 1, 1: 1}}) == {}


def test_majority_names_the_odd_machine_and_refuses_a_tie():
    from unbroken.core.replay import majority_culprits

    names, why = majority_culprits({1: {0: 4, 1: 4, 2: 9, 3: 4}, 2: {0: 6, 1: 6, 2: 1, 3: 6}})
    assert names == (2,) and "culprit [2]" in why
    names, why = majority_culprits({1: {0: 4, 1: 9}})
    assert names == () and "no majority" in why
    assert majority_culprits({1: {0: 4, 1: 4, 2: 4}})[0] == ()


def test_check_schedule_verified_checkpoint_and_restore_target():
    from unbroken.core.replay import restore_target, sdc_check_due, verified_checkpoint

    assert [k for k in range(30) if sdc_check_due(k, 10)] == [9, 19, 29]
    assert not any(sdc_check_due(k, 0) for k in range(30))
    assert verified_checkpoint(19, 10) == 20 and verified_checkpoint(19, 7) is None
    assert restore_target(20, 37, 10) == 20  # the verified one, not the newest
    assert restore_target(None, 37, 10) == 30 and restore_target(0, 8, 10) == 0
    # with the checkpoints known on disk: the newest of them at or before that step
    assert restore_target(20, 37, 10, saved={10, 30}) == 10  # 20's writer died mid-save
    assert restore_target(20, 37, 10, saved={10, 20, 30}) == 20
    assert restore_target(None, 37, 10, saved={10, 20}) == 20
    assert restore_target(20, 37, 10, saved=set()) == 0      # the seeded start
