"""Per-node exclusion history: quarantine after the threshold, release after the cool-down."""

import pytest

from unbroken.core.exclusion import (
    ADMIT,
    QUARANTINED,
    ExclusionError,
    ExclusionPolicy,
    NodeRecord,
    concentration,
    node_status,
    quarantined,
    rank_replacements,
    record_fault,
)

P = ExclusionPolicy(threshold=3, window=100.0, cooldown=1000.0)


def _faults(state, node, times, policy=P):
    for t in times:
        state, _ = record_fault(state, node, t, policy)
    return state


def test_defaults():
    p = ExclusionPolicy()
    assert (p.threshold, p.window, p.cooldown) == (3, 86400.0, 259200.0)


def test_quarantine_exactly_at_the_threshold_within_the_window():
    s = _faults({}, "gpu071", [10.0, 20.0])
    assert node_status(s, "gpu071", 20.0, P)[0] == ADMIT
    s2, why = record_fault(s, "gpu071", 30.0, P)
    assert "quarantined until t=1030" in why and "3 faults" in why
    assert node_status(s2, "gpu071", 30.0, P)[0] == QUARANTINED
    assert s2["gpu071"].quarantines == 1
    assert node_status(s, "gpu071", 30.0, P)[0] == ADMIT  # the input state was not changed
    assert s["gpu071"].faults == (10.0, 20.0)


def test_faults_outside_the_window_do_not_count():
    s = _faults({}, "n1", [0.0, 50.0, 100.0])  # 0.0 is exactly window-old at 100: out
    assert node_status(s, "n1", 100.0, P)[0] == ADMIT
    s = _faults(s, "n1", [120.0])  # 50, 100, 120 within (20, 120]
    assert node_status(s, "n1", 120.0, P)[0] == QUARANTINED


def test_release_after_cooldown_with_a_clean_slate():
    s = _faults({}, "n1", [0.0, 1.0, 2.0])
    assert node_status(s, "n1", 1001.9, P)[0] == QUARANTINED
    status, why = node_status(s, "n1", 1002.0, P)
    assert status == ADMIT and "released at t=1002" in why
    # faults during the quarantine are kept but neither extend it nor count after release
    s = _faults(s, "n1", [500.0, 990.0, 995.0])
    assert s["n1"].quarantined_at == 2.0 and len(s["n1"].faults) == 6
    s = _faults(s, "n1", [1005.0, 1006.0])
    assert node_status(s, "n1", 1006.0, P)[0] == ADMIT  # only 2 counted since release
    s, why = record_fault(s, "n1", 1007.0, P)
    assert node_status(s, "n1", 1007.0, P)[0] == QUARANTINED
    assert s["n1"].quarantines == 2 and "quarantine #2" in why


def test_other_nodes_unaffected_and_quarantined_list():
    s = _faults({}, "a", [1.0, 2.0, 3.0])
    s = _faults(s, "b", [1.0, 2.0])
    assert quarantined(s, 3.0, P) == ["a"]
    assert quarantined(s, 2000.0, P) == []
    assert node_status(s, "never", 3.0, P) == (ADMIT, "node 'never': no recorded faults")


def test_threshold_one_quarantines_on_the_first_fault():
    s, _ = record_fault({}, 7, 5.0, ExclusionPolicy(threshold=1, window=1.0, cooldown=1.0))
    assert node_status(s, 7, 5.5, ExclusionPolicy(threshold=1, window=1.0, cooldown=1.0))[0] \
        == QUARANTINED


def test_rank_replacements_prefers_clean_history_and_drops_quarantined():
    s = _faults({}, "bad", [1.0, 2.0, 3.0])
    s = _faults(s, "meh", [90.0, 95.0])
    s = _faults(s, "old", [0.0])
    ranked, why = rank_replacements(s, ["bad", "meh", "old", "clean", "clean2"], 100.0, P)
    assert ranked == ["clean", "clean2", "old", "meh"]
    assert "'bad'" in why and "4 of 5" in why


def test_concentration_top_k_share():
    s = {}
    s = _faults(s, "x", [1.0, 2.0], ExclusionPolicy(threshold=99))
    s = _faults(s, "y", [1.0], ExclusionPolicy(threshold=99))
    s = _faults(s, "z", [1.0], ExclusionPolicy(threshold=99))
    assert concentration(s, top=1) == 0.5
    assert concentration(s, top=3) == 1.0
    assert concentration({}, top=3) == 0.0


@pytest.mark.parametrize("kwargs, word", [
    ({"threshold": 0}, "threshold=0"),
    ({"threshold": 2.5}, "threshold=2.5"),
    ({"window": 0.0}, "window=0.0"),
    ({"cooldown": -1.0}, "cooldown=-1.0"),
    ({"window": float("inf")}, "window=inf"),
])
def test_bad_policy_raises_one_line(kwargs, word):
    with pytest.raises(ExclusionError) as ei:
        ExclusionPolicy(**kwargs)
    assert word in str(ei.value) and "\n" not in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_bad_times_raise():
    s = _faults({}, "n", [10.0])
    with pytest.raises(ExclusionError, match="fault time 5.0 for node 'n'"):
        record_fault(s, "n", 5.0, P)
    with pytest.raises(ExclusionError, match="fault time=nan"):
        record_fault(s, "n", float("nan"), P)
    with pytest.raises(ExclusionError, match="now='soon'"):
        node_status(s, "n", "soon", P)
    with pytest.raises(ExclusionError, match="top=0"):
        concentration(s, top=0)
    assert NodeRecord().counted(0.0, P) == 0


def test_records_survive_json_and_bad_ones_name_the_value():
    from unbroken.core.exclusion import records_from_json, records_json

    state = _faults({}, 7, [10.0, 20.0, 30.0])  # quarantined at 30
    state = _faults(state, "node-b", [5.0])
    back = records_from_json(records_json(state))
    assert back == state and quarantined(back, 40.0, P) == quarantined(state, 40.0, P) == [7]
    with pytest.raises(ExclusionError, match=r"exclusions\['7'\].faults=.*'x'"):
        records_from_json({"7": {"faults": [1.0, "x"]}})
    with pytest.raises(ExclusionError, match=r"quarantines=-1"):
        records_from_json({"7": {"faults": [], "quarantines": -1}})
    with pytest.raises(ExclusionError, match="not a JSON object"):
        records_from_json([1, 2])
