"""coord.jobstate and coord.lease against a real 3-member etcd cluster: leadership, split
brain, generation fencing of a partitioned worker, member loss and quorum loss."""

from __future__ import annotations

import time

import pytest

from unbroken.coord.etcd import Etcd, EtcdUnavailable
from unbroken.coord.jobstate import EtcdJobState, NotLeader, OtherJob, retry_until
from unbroken.coord.lease import LeaseKeeper, wait_for_lease

pytestmark = [pytest.mark.mp, pytest.mark.server, pytest.mark.timeout(60)]


def _state(cluster, job, me, eps=None):
    return EtcdJobState(Etcd(eps or cluster.endpoints, timeout=1.0), job, me)


def test_a_prefix_holding_another_job_is_refused(cluster):
    a = _state(cluster, "ident", "s1")
    assert "claimed" in a.claim_job({"trainer": "mlp", "groups": 4})
    assert "this job" in a.claim_job({"trainer": "mlp", "groups": 4})  # a standby of it
    with pytest.raises(OtherJob, match="'gpt'"):
        a.claim_job({"trainer": "gpt", "groups": 4})


def test_split_brain_only_the_lease_holder_acts(cluster):
    a, b = _state(cluster, "brain", "sup-a"), _state(cluster, "brain", "sup-b")
    assert a.acquire(2)[0]
    keeper = LeaseKeeper(cluster.endpoints, a.lease, 2)
    try:
        ok, why = b.acquire(2)
        assert not ok and "sup-a" in why
        a.write(status="running", committed="1:4")
        with pytest.raises(NotLeader, match="sup-b never held"):
            b.write(status="done")
        # both alive for longer than a TTL: the holder keeps renewing, the standby only waits
        moves: list[str] = []
        t_end = time.monotonic() + 3
        assert wait_for_lease(b, 2, stopped=lambda: time.monotonic() > t_end,
                              on_move=lambda m, w: moves.append(m))[0] == "stop"
        assert set(moves) == {"wait"} and a.acting()[0] and not keeper.lost.is_set()
    finally:
        keeper.stop()
    # sup-a wedged (alive, no renewals): its lease expires, sup-b takes over ...
    move, why = wait_for_lease(b, 2, stopped=lambda: False)
    assert move == "take" and "sup-b holds the lease" in why
    b.write(status="running")
    # ... and sup-a, waking up, can write nothing
    with pytest.raises(NotLeader, match="the lease is sup-b's"):
        a.write(status="done")
    with pytest.raises(NotLeader):
        a.advance_generation(["x"], {})
    assert a.read()["status"] == "running" and not a.acting()[0] and b.acting()[0]


def test_a_partitioned_worker_never_commits_into_a_newer_generation(cluster):
    sup = _state(cluster, "fence", "sup")
    assert sup.acquire(5)[0]
    g1 = sup.advance_generation([0, 1, 2], {"stack": 1})
    assert sup.commit(g1, 9)[0]
    # the worker of group 2 reaches etcd only through member m2; the link is cut
    worker = _state(cluster, "fence", "w2", eps=[cluster.endpoints[2]])
    cluster.kill(2)
    with pytest.raises(EtcdUnavailable):
        worker.commit(g1, 10)
    # the survivors re-form without it (killing m2 may have started an election: retried)
    g2 = retry_until(lambda: sup.advance_generation([0, 1], {"stack": 2}),
                     time.monotonic() + 10)
    assert sup.commit(g2, 10)[0]
    cluster.restart(2)  # the partition heals; the worker still believes in g1
    ok, why = retry_until(lambda: worker.commit(g1, 11), time.monotonic() + 10)
    assert not ok and f"generation {g1} is fenced" in why
    assert sup.committed() == (g2, 10)
    assert worker.commit(g2, 10) == (False, "step 10 is not past the committed step 10")
    sup.release()


def test_one_member_lost_goes_on_two_lost_pause_then_resume(cluster):
    sup = _state(cluster, "quorum", "sup")
    assert sup.acquire(30)[0]
    g = sup.advance_generation([0, 1], {})
    cluster.kill(0)  # one of three: a quorum is left, commits go on (after an election)
    assert retry_until(lambda: sup.commit(g, 0), time.monotonic() + 5)[0]
    assert sup.commit(g, 1)[0]
    cluster.kill(1)  # two of three: no quorum, nothing is written
    with pytest.raises(EtcdUnavailable):
        sup.commit(g, 2)
    with pytest.raises(EtcdUnavailable):
        sup.write(status="running")
    cluster.restart(1, wait=False)  # a member returns: the paused commit lands, once
    waited: list[str] = []
    ok, _ = retry_until(lambda: sup.commit(g, 2), time.monotonic() + 20,
                        on_wait=waited.append)
    assert ok and sup.committed() == (g, 2)
    assert not sup.commit(g, 2)[0]  # nothing twice
    assert sup.generation() == g and sup.acting()[0]
    sup.release()


def test_a_watch_wakes_at_the_change_and_at_the_lease_expiry(cluster):
    """``Etcd.watch`` (what a member re-attaching and a standby block on instead of polling):
    nothing changes -> None after its timeout; a put by another client -> that PUT at once;
    a lease that runs out -> the DELETE of its key, within the TTL."""
    e, other = Etcd(cluster.endpoints), Etcd(cluster.endpoints[::-1])
    kv, rev = e.get_at("w/addr")
    assert kv is None and rev > 0
    t0 = time.monotonic()
    assert e.watch("w/addr", rev + 1, 0.4) is None
    assert 0.35 <= time.monotonic() - t0 < 2.0
    other.put("w/addr", "epoch-2")  # before the watch starts: its revision is after `rev`
    got = e.watch("w/addr", rev + 1, 5.0)
    assert [(g["type"], g["kv"].value) for g in got] == [("PUT", "epoch-2")]
    lease = other.grant(2)
    other.put("w/leader", "sup-a", lease)
    kv, rev = e.get_at("w/leader")
    assert kv.value == "sup-a"
    t0 = time.monotonic()
    got = e.watch("w/leader", rev + 1, 10.0)
    assert got is not None and got[0]["type"] == "DELETE", got
    assert time.monotonic() - t0 < 3.5  # the TTL (etcd's expiry checks add < 1 s)
