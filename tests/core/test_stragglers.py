"""Straggler traces (parse, per-group factors) and the measured quantities (straggler frequency,
time to a target loss): pure functions, no processes."""

from __future__ import annotations

import math

import pytest

from unbroken.core.stragglers import (
    StragglerSpecError,
    is_pattern,
    parse_stragglers,
    straggler_frequency,
    running_mean,
    time_to_target,
)


def test_persistent_slows_only_the_named_groups_at_every_step():
    tr = parse_stragglers("persistent:1@1.5,persistent:3@3", groups=4)
    m = tr.matrix(steps=5)
    assert m == [[1.0, 1.5, 1.0, 3.0]] * 5


def test_patterns_combine_multiplicatively():
    m = parse_stragglers("persistent:0@2,rotating:1@3", groups=2).matrix(steps=50, seed=4)
    for row in m:  # exactly one group is hit every step (P = 1) and group 0 is always 2x
        assert sorted(row) in ([1.0, 6.0], [2.0, 3.0])


def test_rotating_hits_one_group_per_step_with_probability_p_seeded_by_the_run():
    tr = parse_stragglers("rotating:0.3", groups=4)
    m = tr.matrix(steps=2000, seed=7)
    hit = [sum(f > 1.0 for f in row) for row in m]
    assert set(hit) <= {0, 1}
    assert sum(hit) / len(hit) == pytest.approx(0.3, abs=0.04)
    assert {f for row in m for f in row} == {1.0, 2.0}  # the default factor
    assert m == tr.matrix(steps=2000, seed=7)           # deterministic per seed
    assert m != tr.matrix(steps=2000, seed=8)
    # each group's column alone (what a worker computes) is its column of the matrix
    assert tr.column(2, 2000, seed=7) == [row[2] for row in m]
    # the hits spread over every group
    assert all(any(row[g] > 1 for row in m) for g in range(4))


def test_bursty_is_seeded_by_its_own_seed_and_has_bursts_and_mild_jitter():
    a = parse_stragglers("bursty:0", groups=4).matrix(steps=400, seed=1)
    assert a == parse_stragglers("bursty:0", groups=4).matrix(steps=400, seed=99)
    assert a != parse_stragglers("bursty:1", groups=4).matrix(steps=400, seed=1)
    flat = [f for row in a for f in row]
    assert min(flat) >= 1.0
    assert max(flat) >= 1.5                       # bursts happen
    quiet = sum(f < 1.2 for f in flat) / len(flat)
    assert 0.5 < quiet < 1.0                      # most of the time a group runs near full speed
    # a burst lasts: the steps of a group over 1.5x come in runs, not alone
    col = [row[0] for row in a]
    over = [f >= 1.5 for f in col]
    runs = sum(1 for i, x in enumerate(over) if x and (i == 0 or not over[i - 1]))
    assert runs == 0 or sum(over) / runs > 2


def test_csv_holds_each_slowdown_until_the_next_row_for_that_group():
    text = "step,group,slowdown\n# a comment\n\n2,1,3.0\n5,1,1.0\n3,0,1.5\n"
    tr = parse_stragglers("trace.csv", groups=2, csv_text=text)
    assert [row for row in tr.matrix(steps=7)] == [
        [1.0, 1.0], [1.0, 1.0], [1.0, 3.0], [1.5, 3.0], [1.5, 3.0], [1.5, 1.0], [1.5, 1.0]]


def test_a_spare_or_none_is_never_slowed():
    tr = parse_stragglers("persistent:1@2", groups=4)
    assert tr.column(4, 3) == [1.0, 1.0, 1.0]  # uid 4: a spare, outside the layout
    assert parse_stragglers("none", groups=4).empty
    assert not tr.empty


def test_is_pattern_tells_patterns_from_file_names():
    assert is_pattern("persistent:1@2") and is_pattern("rotating:0.3,bursty:1")
    assert is_pattern("none")
    assert not is_pattern("trace.csv") and not is_pattern("dir/x:y.csv")


@pytest.mark.parametrize("spec, named", [
    ("", "empty"),
    ("slow:1@2", "unknown pattern 'slow:1@2'"),
    ("persistent", "unknown pattern 'persistent'"),
    ("persistent:1", "needs a factor"),
    ("persistent:x@2", "persistent group 'x' is not an integer"),
    ("persistent:1@fast", "persistent factor 'fast' is not a number"),
    ("persistent:1@0.5", "persistent factor '0.5' is below 1.0"),
    ("persistent:1@nan", "is not a finite number"),
    ("persistent:4@2", "group 4 is not in 0..3"),
    ("persistent:-1@2", "group -1 is not in 0..3"),
    ("persistent:1@2,persistent:1@3", "group 1 is given twice"),
    ("bursty:x", "bursty seed 'x' is not an integer"),
    ("bursty:-1", "bursty seed -1 must be >= 0"),
    ("bursty:1,bursty:2", "bursty is given twice"),
    ("rotating:1.5", "rotating probability 1.5 is not in [0, 1]"),
    ("rotating:-0.1", "rotating probability -0.1 is not in [0, 1]"),
    ("rotating:often", "rotating probability 'often' is not a number"),
    ("rotating:0.3@0.9", "rotating factor '0.9' is below 1.0"),
    ("persistent:1@2,oops", "unknown pattern 'oops'"),
])
def test_bad_specs_are_one_line_naming_the_value(spec, named):
    with pytest.raises(StragglerSpecError) as e:
        parse_stragglers(spec, groups=4)
    msg = str(e.value)
    assert named in msg and "\n" not in msg, msg
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("text, named", [
    ("0,1,2.0\n3,1\n", "line 2: '3,1' is not step,group,slowdown"),
    ("0,1,2.0,7\n", "line 1: '0,1,2.0,7' is not step,group,slowdown"),
    ("step,group,slowdown\nx,1,2\n", "line 2: step 'x' is not an integer"),
    ("-1,1,2\n", "line 1: step -1 must be >= 0"),
    ("0,9,2\n", "line 1: group 9 is not in 0..3"),
    ("0,one,2\n", "line 1: group 'one' is not an integer"),
    ("\n0,1,0.5\n", "line 2: slowdown '0.5' is below 1.0"),
    ("0,1,inf\n", "line 1: slowdown 'inf' is not a finite number"),
    ("0,1,slow\n", "line 1: slowdown 'slow' is not a number"),
    ("0,1,2\nstep,group,slowdown\n", "line 2: step 'step' is not an integer"),  # header first
])
def test_bad_csv_rows_name_the_line(text, named):
    with pytest.raises(StragglerSpecError) as e:
        parse_stragglers("t.csv", groups=4, csv_text=text)
    assert named in str(e.value) and "t.csv" in str(e.value), str(e.value)


def test_straggler_frequency_is_the_share_of_steps_with_a_group_over_1_2x_the_fastest():
    times = {0: {"a": 1.0, "b": 1.1},      # 1.1x: not a straggler
             1: {"a": 1.0, "b": 1.25},     # 1.25x: a straggler
             2: {"a": 2.0, "b": 1.0, "c": 1.0},
             3: {"a": 1.0, "b": 1.2},      # exactly 1.2x is not "over"
             4: {"a": 1.0},                # one group: not counted
             5: {"a": 0.0, "b": 1.0}}      # no positive fastest time: not counted
    assert straggler_frequency(times) == pytest.approx(2 / 4)
    assert straggler_frequency({}) is None
    assert straggler_frequency({0: {"a": 1.0}}) is None


def test_time_to_target_is_the_first_commit_at_or_below_the_target():
    pts = [(12.0, 0.9), (10.0, 2.0), (11.0, 1.0), (13.0, 0.5)]  # out of order on purpose
    assert time_to_target(pts, 1.0, t0=9.0) == pytest.approx(2.0)
    assert time_to_target(pts, 0.5, t0=9.0) == pytest.approx(4.0)
    assert time_to_target(pts, 0.1, t0=9.0) is None
    assert time_to_target([], 1.0, t0=0.0) is None
    assert time_to_target([(1.0, math.nan), (2.0, 0.1)], 1.0, t0=0.0) == 2.0


def test_running_mean_smooths_in_time_order_and_drops_non_finite_losses():
    pts = [(3.0, 3.0), (1.0, 1.0), (2.0, float("nan")), (4.0, 5.0), (2.5, 2.0)]
    assert running_mean(pts, 2) == [(2.5, 1.5), (3.0, 2.5), (4.0, 4.0)]
    assert running_mean(pts, 1) == [(1.0, 1.0), (2.5, 2.0), (3.0, 3.0), (4.0, 5.0)]
    assert running_mean(pts, 5) == []
    # a lucky dip alone does not reach a target the smoothed curve has not reached
    dip = [(float(k), 2.0) for k in range(5)] + [(5.0, 0.5), (6.0, 2.0)]
    assert time_to_target(dip, 1.0, 0.0) == 5.0
    assert time_to_target(running_mean(dip, 3), 1.0, 0.0) is None
    with pytest.raises(ValueError):
        running_mean(pts, 0)
