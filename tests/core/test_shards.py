"""Data plan and exactly-once ledger (pure, no torch)."""

from __future__ import annotations

import pytest

from unbroken.core.shards import DataPlan, exactly_once


def test_shards_partition_each_epoch_and_are_deterministic():
    p = DataPlan(dataset_size=103, types=4, shard_size=5, seed=7)
    assert p.steps_per_epoch == 5  # 103 // 20, tail of 3 dropped
    for e in range(3):
        seen = [i for k in range(e * 5, e * 5 + 5) for i in p.step_samples(k)]
        assert len(seen) == len(set(seen)) == 100  # no sample twice within an epoch
        assert set(seen) <= set(range(103))
    q = DataPlan(dataset_size=103, types=4, shard_size=5, seed=7)
    assert all(p.shard(k, t) == q.shard(k, t) for k in range(12) for t in range(4))
    # epochs are reshuffled, seeds differ
    assert p.step_samples(0) != p.step_samples(5)
    assert DataPlan(103, 4, 5, seed=8).step_samples(0) != p.step_samples(0)
    # the step is the concatenation of its shard types
    assert p.step_samples(3) == sum((p.shard(3, t) for t in range(4)), [])


def test_bad_inputs():
    with pytest.raises(ValueError, match="smaller than one global batch"):
        DataPlan(10, 4, 3)
    with pytest.raises(ValueError, match="types"):
        DataPlan(10, 0, 3)
    p = DataPlan(40, 4, 2)
    with pytest.raises(ValueError, match="shard type 4"):
        p.shard(0, 4)
    with pytest.raises(ValueError, match="step"):
        p.shard(-1, 0)


def test_exactly_once_finds_missing_duplicate_and_stray():
    recs = [(k, t, t) for k in range(3) for t in range(4)]
    rep = exactly_once(recs, steps=3, types=4)
    assert rep.ok and rep.records == 12
    # group 1 dies at step 1; type 1 is patched by group 0 at step 1 and 2: still exactly once
    recs = [(0, t, t) for t in range(4)] + [(k, t, 0 if t == 1 else t)
                                             for k in (1, 2) for t in range(4)]
    assert exactly_once(recs, 3, 4).ok
    bad = [r for r in recs if r != (2, 3, 3)] + [(1, 1, 1), (5, 0, 0), (0, 9, 0)]
    rep = exactly_once(bad, 3, 4)
    assert not rep.ok
    assert rep.missing == ((2, 3),)
    assert rep.duplicated == ((1, 1),)
    assert rep.stray == ((0, 9), (5, 0))
