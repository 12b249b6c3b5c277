"""core.stacks: normalisation, majority/outlier split, and the smallest covering group."""

import pytest

from unbroken.core.stacks import (
    EVICT,
    INCONCLUSIVE,
    NONE,
    Coord,
    StacksError,
    aggregate,
    cluster,
    covering_group,
    normalise,
)

PYSPY_A = """Process 4711: /opt/venv/bin/python train.py --rank 0
Python v3.11.7 (/opt/venv/bin/python3.11)

Thread 4711 (idle): "MainThread"
    wait (distributed_c10d.py:3252)
    all_reduce (distributed_c10d.py:2501)
    Trainer.train_step (train.py:88)
    <module> (train.py:120)
Thread 4790 (active): "Thread-1 (loader)"
    _worker_loop (loader.py:41)
"""

# the same code path in another process: other pid, thread ids, line numbers, state, order
PYSPY_B = """Process 5123: /home/u/venv/bin/python train.py --rank 7
Python v3.11.7 (/home/u/venv/bin/python3.11)

Thread 5200 (active+gil): "Thread-1 (loader)"
    _worker_loop (loader.py:44)
Thread 5123 (active): "MainThread"
    wait (distributed_c10d.py:3253)
    all_reduce (distributed_c10d.py:2502)
    Trainer.train_step (train.py:90)
    <module> (train.py:121)
"""

FAULTHANDLER_A = """Thread 0x00007f5e9c3fc6c0 (most recent call first):
  File "/srv/app/loader.py", line 41 in _worker_loop

Current thread 0x00007f5e9d23db80 (most recent call first):
  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in wait
  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/srv/app/train.py", line 88 in train_step
  File "/srv/app/train.py", line 120 in <module>
"""

STUCK = """Process 4712: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4712 (active): "MainThread"
    load_batch (data.py:17)
    Trainer.train_step (train.py:80)
    <module> (train.py:120)
"""

OTHER = """Thread 1 (idle): "MainThread"
    save_checkpoint (ckpt.py:5)
    <module> (train.py:130)
"""


def healthy(i):
    return PYSPY_A.replace("4711", str(4711 + i)).replace(":88)", f":{88 + i % 3})")


def grid(dp, pp, tp):
    """rank -> Coord, rank = (d * pp + p) * tp + t."""
    return {(d * pp + p) * tp + t: Coord(d, p, t) for d in range(dp) for p in range(pp) for t in range(tp)}


# --- normalisation -----------------------------------------------------------------------


def test_same_path_normalises_equal_despite_noise():
    assert normalise(PYSPY_A) == normalise(PYSPY_B)


def test_pyspy_and_faulthandler_normalise_equal():
    assert normalise(PYSPY_A) == normalise(FAULTHANDLER_A)


def test_different_path_stays_different():
    assert normalise(PYSPY_A) != normalise(STUCK)
    assert normalise(PYSPY_A) != normalise(OTHER)


def test_only_the_main_thread_counts_when_the_dump_names_it():
    # the same training-thread position, helper threads caught at different points
    busy = PYSPY_A.replace("_worker_loop (loader.py:41)", "multi_get (store.py:9)\n"
                           "    _monitor (ftcomm.py:640)")
    extra = PYSPY_A + 'Thread 4800 (idle): "health"\n    wait (threading.py:320)\n'
    assert normalise(busy) == normalise(PYSPY_A) == normalise(extra)
    assert "_worker_loop" not in normalise(PYSPY_A)
    # no named main thread: every block counts
    anon = "Thread 1 (idle): \"a\"\n    f (x.py:1)\nThread 2 (idle): \"b\"\n    g (y.py:2)\n"
    assert "f (x.py)" in normalise(anon) and "g (y.py)" in normalise(anon)


def test_normalised_text_has_no_numbers_or_paths():
    text = normalise(PYSPY_A) + normalise(FAULTHANDLER_A)
    for noise in ("4711", "3252", "0x00007f", "/srv/app", "MainThread", "idle", "Trainer."):
        assert noise not in text
    assert "train_step (train.py)" in text


def test_locals_values_and_native_addresses_are_stripped():
    a = """Thread 1 (idle): "MainThread"
    step (train.py:3)
        Arguments:
            loss: tensor([2.3412, 1.9921])
            pid: 4711
    0x7f5e9ca4524a (libc.so.6)
"""
    b = a.replace("2.3412, 1.9921", "0.1, 0.2, 0.3").replace("4711", "99").replace("9ca4524a", "00000001")
    assert normalise(a) == normalise(b)
    assert "loss: ?" in normalise(a) and "0x? (libc.so.N)" in normalise(a)


def test_normalise_rejects_non_text():
    with pytest.raises(StacksError, match="dump=None"):
        normalise(None)


# --- clustering and the majority -----------------------------------------------------------


def test_cluster_largest_first():
    dumps = {0: healthy(0), 1: STUCK, 2: healthy(2), 3: healthy(3)}
    cl = cluster(dumps)
    assert [r for _, r in cl] == [(0, 2, 3), (1,)]


def test_majority_healthy_outlier_evicts_its_dp_replica():
    coords = grid(4, 1, 1)
    dumps = {r: healthy(r) for r in coords}
    dumps[2] = STUCK
    v, reason = aggregate(dumps, coords)
    assert (v.action, v.kind, v.index) == (EVICT, "dp", 2)
    assert v.outliers == (2,) and v.ranks == (2,) and v.healthy == (0, 1, 3)
    assert "dp group 2" in reason and "3/4" in reason


def test_all_same_is_none():
    coords = grid(2, 1, 2)
    v, reason = aggregate({r: healthy(r) for r in coords}, coords)
    assert v.action == NONE and v.ranks == () and v.outliers == ()
    assert "no outlier" in reason


def test_single_rank_is_none():
    v, _ = aggregate({0: STUCK}, {0: Coord(0, 0, 0)})
    assert v.action == NONE


def test_tie_is_inconclusive_whole_job():
    coords = grid(4, 1, 1)
    dumps = {0: healthy(0), 1: healthy(1), 2: STUCK, 3: STUCK}
    v, reason = aggregate(dumps, coords)
    assert (v.action, v.kind, v.index) == (INCONCLUSIVE, "job", None)
    assert v.ranks == (0, 1, 2, 3) and v.healthy == ()
    assert "no strict majority" in reason and "2+2" in reason


def test_two_ranks_disagreeing_is_inconclusive():
    v, _ = aggregate({0: healthy(0), 1: STUCK}, grid(2, 1, 1))
    assert v.action == INCONCLUSIVE


def test_all_different_is_inconclusive():
    coords = grid(3, 1, 1)
    v, reason = aggregate({0: healthy(0), 1: STUCK, 2: OTHER}, coords)
    assert v.action == INCONCLUSIVE and "1+1+1" in reason


def test_plurality_without_majority_is_inconclusive():
    coords = grid(5, 1, 1)
    dumps = {0: healthy(0), 1: healthy(1), 2: STUCK, 3: OTHER, 4: "<dump failed: x>"}
    v, _ = aggregate(dumps, coords)
    assert v.action == INCONCLUSIVE


def test_failed_dump_is_an_outlier():
    coords = grid(4, 1, 1)
    dumps = {r: healthy(r) for r in coords}
    dumps[1] = "<dump failed: pid 99: py-spy dump exit 1: Permission denied>"
    v, _ = aggregate(dumps, coords)
    assert v.action == EVICT and v.outliers == (1,)


def test_several_outlier_clusters_are_all_outliers():
    coords = grid(4, 1, 2)  # 8 ranks
    dumps = {r: healthy(r) for r in coords}
    dumps[2], dumps[3] = STUCK, OTHER  # both in dp replica 1
    v, _ = aggregate(dumps, coords)
    assert (v.kind, v.index, v.ranks, v.outliers) == ("dp", 1, (2, 3), (2, 3))


# --- the smallest covering group --------------------------------------------------------------


def test_one_outlier_maps_to_its_replica_with_tp_and_pp():
    coords = grid(4, 2, 2)  # 16 ranks; a replica has pp*tp = 4, a stage dp*tp = 8
    kind, index, ranks = covering_group([5], coords)  # rank 5 = Coord(1, 0, 1)
    assert coords[5] == Coord(1, 0, 1)
    assert (kind, index) == ("dp", 1)
    assert ranks == (4, 5, 6, 7)
    assert all(coords[r].dp == 1 for r in ranks)


def test_outliers_across_replicas_at_one_stage_map_to_that_stage():
    coords = grid(4, 2, 2)
    outs = [r for r, c in coords.items() if c.pp == 1 and c.dp in (0, 3)]
    kind, index, ranks = covering_group(outs, coords)
    assert (kind, index) == ("pp", 1)
    assert ranks == tuple(sorted(r for r, c in coords.items() if c.pp == 1))


def test_outliers_across_replicas_and_stages_map_to_job():
    coords = grid(4, 2, 2)
    outs = [r for r, c in coords.items() if (c.dp, c.pp) in ((0, 0), (2, 1))]
    kind, index, ranks = covering_group(outs, coords)
    assert (kind, index, ranks) == ("job", None, tuple(range(16)))


def test_a_majority_whose_outliers_only_the_job_covers_evicts_nobody():
    # 8 replicas of one rank: 5 wait in one place, 3 elsewhere in different replicas
    coords = grid(8, 1, 1)
    dumps = {r: "thread\nallreduce (ftcomm.py)" for r in coords}
    for r in (0, 3, 6):
        dumps[r] = f"thread\nuser_code (model.py)\nrank_{r} (x.py)"
    v, why = aggregate(dumps, coords)
    assert v.action == INCONCLUSIVE and v.kind == "job" and set(v.outliers) == {0, 3, 6}
    assert "only the whole job covers them" in why


def test_stage_smaller_than_replica_wins():
    coords = grid(2, 4, 1)  # replica: 4 ranks; stage: 2 ranks
    kind, index, ranks = covering_group([coords_rank(coords, 1, 3, 0)], coords)
    assert (kind, index) == ("pp", 3) and len(ranks) == 2


def test_equal_sizes_prefer_the_replica():
    coords = grid(2, 2, 1)  # replica and stage both 2 ranks
    kind, index, _ = covering_group([coords_rank(coords, 1, 0, 0)], coords)
    assert (kind, index) == ("dp", 1)


def coords_rank(coords, dp, pp, tp):
    return next(r for r, c in coords.items() if c == Coord(dp, pp, tp))


def test_aggregate_with_pipeline_stage_outliers():
    coords = grid(3, 2, 1)  # 6 ranks; stage 1 stuck in every replica -> 3 outliers of 6: tie
    dumps = {r: (STUCK if c.pp == 1 else healthy(r)) for r, c in coords.items()}
    assert aggregate(dumps, coords)[0].action == INCONCLUSIVE
    coords = grid(4, 2, 1)  # 8 ranks; stage 1 stuck in replicas 0 and 2 -> pp group 1
    dumps = {r: (STUCK if c.pp == 1 and c.dp in (0, 2) else healthy(r)) for r, c in coords.items()}
    v, reason = aggregate(dumps, coords)
    assert (v.action, v.kind, v.index) == (EVICT, "pp", 1)
    assert "pp group 1" in reason


# --- errors -----------------------------------------------------------------------------------


def test_errors_name_the_bad_value():
    with pytest.raises(StacksError, match=r"Coord.tp=-1"):
        Coord(0, 0, -1)
    with pytest.raises(StacksError, match=r"Coord.dp=True"):
        Coord(True, 0, 0)
    with pytest.raises(StacksError, match="dumps={} is empty"):
        aggregate({}, {0: Coord(0, 0, 0)})
    with pytest.raises(StacksError, match=r"ranks \[1\] have dumps but no coordinates"):
        aggregate({0: "a", 1: "b"}, {0: Coord(0, 0, 0)})
    with pytest.raises(StacksError, match=r"ranks \[1\] have coordinates but no dump"):
        aggregate({0: "a"}, {0: Coord(0, 0, 0), 1: Coord(1, 0, 0)})
    with pytest.raises(StacksError, match=r"coords\[1\]=Coord\(dp=0, pp=0, tp=0\) is also coords\[0\]"):
        aggregate({0: "a", 1: "b"}, {0: Coord(0, 0, 0), 1: Coord(0, 0, 0)})
    with pytest.raises(StacksError, match=r"coords\[0\]=\(0, 0, 0\) is not a Coord"):
        aggregate({0: "a"}, {0: (0, 0, 0)})
    with pytest.raises(StacksError, match="outlier 9 has no coordinates"):
        covering_group([9], {0: Coord(0, 0, 0)})
    with pytest.raises(StacksError, match="outliers=.. is empty"):
        covering_group([], {0: Coord(0, 0, 0)})


def test_vote_needs_two_rounds_that_agree_on_the_same_eviction():
    from unbroken.core.stacks import StackVerdict, vote

    def v(action, ranks):
        return StackVerdict(action, "dp" if action == "evict" else "job", 2, ranks, ranks,
                            (), ())

    chosen, reason = vote([v("evict", (2,)), v("inconclusive", (0, 1, 2, 3)), v("evict", (2,))])
    assert chosen is not None and chosen.ranks == (2,) and "2 of 3" in reason
    chosen, _ = vote([v("evict", (2,)), v("evict", (3,)), v("inconclusive", (0, 1, 2, 3))])
    assert chosen is None  # two rounds, two different answers: no eviction
    assert vote([v("none", ())] * 3)[0] is None
