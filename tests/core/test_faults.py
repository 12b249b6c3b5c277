"""The demo's fault schedule: parsing, validation messages, the scaled default."""

import pytest

from unbroken.core.faults import (
    CHAOS_XIDS,
    KINDS,
    REMOVING,
    chaos_faults,
    Fault,
    FaultSpecError,
    default_faults,
    format_faults,
    holder_faults,
    parse_faults,
)


def test_parse_sorted_by_step_and_whitespace_tolerant():
    got = parse_faults(" kill:2@61 , hang : 3 @ 60,kill:1@20 ", groups=4, steps=200)
    assert got == [Fault("kill", 1, 20), Fault("hang", 3, 60), Fault("kill", 2, 61)]
    assert parse_faults("none", 4, 200) == [] and parse_faults(" NONE ", 4, 200) == []
    assert KINDS == ("kill", "hang", "slow", "stall", "nan", "flip", "xid", "update", "node",
                     "cut")


def test_node_faults_name_a_node_and_need_node_agents():
    got = parse_faults("node:2@5,cut:0@7,kill:5@5", groups=6, steps=20, nodes=3)
    assert got == [Fault("node", 2, 5), Fault("kill", 5, 5), Fault("cut", 0, 7)]
    assert holder_faults(got, 2) == []  # the launcher's, not a slot's holder's
    with pytest.raises(FaultSpecError, match="node 3 out of range 0..2"):
        parse_faults("node:3@5", groups=6, steps=20, nodes=3)
    with pytest.raises(FaultSpecError, match="needs node agents"):
        parse_faults("cut:0@5", groups=6, steps=20)


@pytest.mark.parametrize("spec, words", [
    ("kill:1@20,boom:2@30", ["'boom:2@30'", "unknown kind 'boom'"]),
    ("kill:4@20", ["'kill:4@20'", "group 4", "0..3"]),
    ("kill:-1@20", ["group -1", "0..3"]),
    ("hang:1@0", ["'hang:1@0'", "step 0", "1..199"]),
    ("hang:1@200", ["step 200", "1..199"]),
    ("kill:1@20,hang:1@20", ["'hang:1@20'", "slot 1 already loses its process at step 20"]),
    ("kill:1-20", ["'kill:1-20'", "malformed"]),
    ("kill:1@20,", ["''", "malformed"]),
    ("none,kill:1@20", ["'none'", "malformed"]),
    ("", ["empty"]),
    ("nan7:1@20", ["'nan7:1@20'", "only xid takes a number"]),
    ("update:1@20", ["'update:1@20'", "update@step"]),
    ("kill@20", ["'kill@20'", "malformed"]),
    ("flip:1@30,slow:1@30", ["slot 1 already loses"]),
])
def test_parse_errors_name_the_token_and_why(spec, words):
    with pytest.raises(FaultSpecError) as ei:
        parse_faults(spec, groups=4, steps=200)
    msg = str(ei.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg
    assert isinstance(ei.value, ValueError)  # the CLI's one-line exit-2 path catches ValueError


def test_a_slot_fails_again_and_each_holder_gets_its_share():
    faults = parse_faults("kill:1@10,nan:1@5,kill:1@30,nan:1@20,hang:1@40,xid:1@12,kill:2@7",
                          groups=4, steps=100)
    # the first holder: the nan at 5 and the kill at 10; the nan at 20 is the replacement's
    first = holder_faults(faults, 1)
    assert [f.spec for f in first] == ["nan:1@5", "kill:1@10"]
    rest = [f for f in faults if f not in first]
    assert [f.spec for f in holder_faults(rest, 1)] == ["nan:1@20", "kill:1@30"]
    rest = [f for f in rest if f not in holder_faults(rest, 1)]
    assert [f.spec for f in holder_faults(rest, 1)] == ["hang:1@40"]
    # the xid is the launcher's, never a holder's
    assert all(f.kind != "xid" for f in holder_faults(faults, 1) + holder_faults(rest, 1))
    assert holder_faults(faults, 3) == []


def test_default_for_four_groups_two_hundred_steps_is_exact():
    assert format_faults(default_faults(4, 200)) == "kill:1@20,hang:3@60,kill:2@61"


@pytest.mark.parametrize("groups", range(1, 9))
@pytest.mark.parametrize("steps", [2, 3, 5, 10, 37, 100, 1000])
def test_default_is_always_valid(groups, steps):
    faults = default_faults(groups, steps)
    assert parse_faults(format_faults(faults), groups, steps) == faults
    assert len(faults) == len({f.group for f in faults}) <= 3


def test_default_scales_and_drops_what_does_not_fit():
    assert format_faults(default_faults(8, 1000)) == "kill:1@100,hang:7@300,kill:2@301"
    assert format_faults(default_faults(3, 100)) == "kill:1@10,hang:2@30"
    assert format_faults(default_faults(2, 100)) == "kill:1@10"


def test_format_is_inverse_of_parse():
    spec = "kill:0@1,hang:5@7,kill:2@7"
    assert format_faults(parse_faults(spec, 6, 8)) == spec
    assert format_faults([]) == "none"


def test_new_kinds_parse_and_format_round_trip():
    spec = "nan:1@10,xid43:1@20,update@30,flip:1@40,xid:2@50"
    got = parse_faults(spec, 4, 200)
    assert [f.kind for f in got] == ["nan", "xid", "update", "flip", "xid"]
    assert got[1].code == 43 and got[4].code == 79  # plain xid: 79, the evict class
    assert got[2].group == -1
    assert format_faults(got) == "nan:1@10,xid43:1@20,update@30,flip:1@40,xid79:2@50"
    # nan and xid leave the group's process alone, so they may share a group with a removal
    assert parse_faults(format_faults(got), 4, 200) == got


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("groups, steps", [(4, 200), (4, 60), (6, 300)])
def test_chaos_is_seeded_valid_and_complete(seed, groups, steps):
    faults = chaos_faults(seed, groups, steps)
    assert faults == chaos_faults(seed, groups, steps)
    assert parse_faults(format_faults(faults), groups, steps) == faults
    kinds = sorted(f.kind for f in faults)
    assert kinds == sorted(["kill", "hang", "slow", "flip", "nan", "xid", "update"])
    assert len({f.step for f in faults}) == len(faults)  # one fault per step
    removed = {f.group: f.step for f in faults if f.kind in REMOVING}
    nan = next(f for f in faults if f.kind == "nan")
    assert removed.get(nan.group, steps) > nan.step  # the nan's group is alive then
    xid = next(f for f in faults if f.kind == "xid")
    assert xid.code in CHAOS_XIDS
    kill = next(f for f in faults if f.kind == "kill")
    assert xid.group == kill.group and kill.step < xid.step  # a spare holds the slot then


def test_chaos_differs_between_seeds():
    assert len({format_faults(chaos_faults(s, 4, 200)) for s in range(8)}) == 8
