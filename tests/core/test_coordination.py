"""core.coordination: the store choice, who may act, a standby's move, generation fencing."""

import pytest

from unbroken.core.coordination import (StoreURL, check_job_name, may_act, may_commit,
                                        parse_store, same_job, takeover)


def test_parse_store_default_and_etcd_endpoints():
    assert parse_store("tcp") == StoreURL("tcp")
    assert parse_store("etcd://a:2379,10.0.0.2:2380") == StoreURL("etcd", ("a:2379",
                                                                         "10.0.0.2:2380"))


@pytest.mark.parametrize("bad", ["http://a:1", "etcd://", "etcd://a", "etcd://a:0",
                                 "etcd://a:99999", "etcd://a:1,b", "redis://x:1"])
def test_parse_store_refuses_with_one_line_naming_the_value(bad):
    with pytest.raises(ValueError) as e:
        parse_store(bad)
    assert repr(bad) in str(e.value) and "\n" not in str(e.value)


def test_job_name_is_one_key_segment():
    assert check_job_name("run-7.a_b") == "run-7.a_b"
    for bad in ("", "a/b", "x y"):
        with pytest.raises(ValueError):
            check_job_name(bad)


def test_only_the_lease_holder_acts():
    assert may_act(("s1", 5), "s1", 5)[0]
    ok, why = may_act(("s2", 9), "s1", 5)
    assert not ok and "s2" in why
    # the same name re-created after an expiry is another lease: a deposed s1 does not act
    assert not may_act(("s1", 9), "s1", 5)[0]
    assert not may_act(None, "s1", 5)[0]


def test_standby_waits_takes_over_or_stops():
    assert takeover("s1", "running")[0] == "wait"
    assert takeover(None, None)[0] == "wait"
    assert takeover(None, "running")[0] == "take"
    assert takeover("s1", "done")[0] == "stop"


def test_an_old_generation_never_commits_into_a_newer_one():
    assert may_commit(3, 3, 10, 9)[0]
    ok, why = may_commit(2, 3, 10, 9)
    assert not ok and "generation 2 is fenced" in why
    assert not may_commit(3, 3, 9, 9)[0]  # forwards only: nothing twice


def test_same_job_refuses_another_jobs_prefix():
    me = {"trainer": "mlp", "groups": 4}
    assert same_job(None, me)[0] and same_job(dict(me), me)[0]
    ok, why = same_job({"trainer": "gpt", "groups": 4}, me)
    assert not ok and "'gpt'" in why and "--job" in why


def _rep(step, gen=2, members=(0, 1, 2), slots=None):
    slots = slots or {str(m): m for m in members}
    return {"step": step, "gen": gen, "members": list(members), "slot_of": slots}


def test_adoption_waits_for_every_member_then_adopts_where_they_stopped():
    from unbroken.core.coordination import adoption

    got, why = adoption({}, final=False)
    assert got is None and "no member" in why
    got, why = adoption({0: _rep(40), 1: _rep(40)}, final=False)
    assert got is None and "[2]" in why  # member 2 not re-attached yet: wait
    got, why = adoption({0: _rep(40), 1: _rep(40), 2: _rep(40)}, final=False)
    assert got.members == (0, 1, 2) and got.step == 40 and got.missing == () and got.gen == 2
    assert "after step 39" in why


def test_adoption_names_the_missing_as_lost_and_refuses_split_boundaries():
    from unbroken.core.coordination import adoption

    # a member replaced earlier (uid 5 holds slot 1); member 2 never came back: lost
    reps = {0: _rep(40, members=(0, 5, 2), slots={"0": 0, "5": 1, "2": 2, "1": 1}),
            5: _rep(40, members=(0, 5, 2))}
    got, why = adoption(reps, final=True)
    assert got.members == (0, 2, 5) and got.missing == (2,) and "lost" in why
    assert got.slot_of == {0: 0, 5: 1, 2: 2}  # the dead uid 1's old slot entry dropped
    # an older generation's report does not decide; two commits apart in one: no adoption
    got, why = adoption({0: _rep(40), 1: _rep(42), 2: _rep(41, gen=1)}, final=True)
    assert got is None and "[40, 41, 42]" in why and "checkpoint" in why
    got, why = adoption({0: _rep(40), 1: _rep(42)}, final=True)
    assert got is None and "more than one commit apart" in why


def test_adoption_of_members_one_commit_apart_names_the_ones_behind():
    from unbroken.core.coordination import adoption

    # a peer died mid-all-reduce as the coordinator went: 0 and 2 committed step 40, 1 saw
    # the op fail. The job's next step is 41; 1 is rolled forward by the first settle
    got, why = adoption({0: _rep(41), 1: _rep(40), 2: _rep(41)}, final=True)
    assert (got.step, got.behind, got.missing) == (41, (1,), ())
    assert "after step 40" in why and "[1] one commit behind" in why
    # the one that died never reports: lost, the behind one still rolled forward
    got, why = adoption({0: _rep(41), 1: _rep(40)}, final=True)
    assert (got.step, got.behind, got.missing) == (41, (1,), (2,)) and "lost" in why
    assert adoption({0: _rep(41), 1: _rep(41), 2: _rep(41)}, final=True)[0].behind == ()
    # a group of several ranks: one rank behind its siblings is no boundary of the group's
    got, why = adoption({0: {**_rep(41), "steps": [41, 40]}, 1: _rep(41), 2: _rep(41)},
                        final=True)
    assert got is None and "ranks of group 0" in why and "[40, 41]" in why
