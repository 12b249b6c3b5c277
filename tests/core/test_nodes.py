"""core.nodes: group placement on nodes, silent agents, where a spare goes (pure)."""

from __future__ import annotations

import pytest

from unbroken.core.nodes import (HealthPolicy, check_room, health_problems, gloo_interface, no_node_left, on_live_nodes, place_groups,
                                 rejoining, spare_node, stale_nodes)


def test_six_groups_on_three_nodes_are_placed_safely():
    node_of, warning = place_groups(6, 2, 3)
    assert warning is None
    assert sorted(node_of.count(k) for k in range(3)) == [2, 2, 2]


def test_an_unsafe_placement_warns_with_the_nodes_it_takes():
    node_of, warning = place_groups(4, 2, 1)
    assert node_of == [0, 0, 0, 0]
    assert warning.startswith("1 nodes: no balanced safe placement")
    assert "it takes 2 nodes" in warning


def test_more_nodes_than_groups_is_bad_input():
    with pytest.raises(ValueError, match="exceeds the number of groups"):
        place_groups(3, 2, 4)


def test_a_stopped_agent_is_stale_once_the_others_beat_on():
    # (counter, last change, beat clock then): node 1 stopped at t=0, the others beat
    obs = {0: (30, 1.95, 19.0), 1: (10, 0.0, 0.0), 2: (29, 1.9, 19.0)}
    assert stale_nodes(obs, now=2.0, staleness=1.0, beats=20.0, heartbeat=0.1) == [1]
    # the same silence while nobody else beat either (a starved coordinator): nobody yet
    assert stale_nodes(obs, now=2.0, staleness=1.0, beats=5.0, heartbeat=0.1) == []
    # ... unless it lasts three times the staleness
    assert stale_nodes(obs, now=3.5, staleness=1.0, beats=5.0, heartbeat=0.1) == [1]


def test_an_agent_that_never_beat_is_not_judged():
    assert stale_nodes({0: (0, 0.0, 0.0)}, now=10.0, staleness=1.0, beats=100.0,
                       heartbeat=0.1) == []


def test_a_spare_goes_to_the_least_loaded_live_node():
    assert spare_node({0: 3, 1: 2, 2: 2}, [0, 1, 2]) == 1
    assert spare_node({0: 3, 1: 2, 2: 2}, [0, 2]) == 2
    assert spare_node({}, [2, 1]) == 1
    assert spare_node({0: 1}, []) is None


def test_a_spare_goes_only_where_the_agent_has_room():
    # node 1 is the least loaded but its agent said it runs 2 processes at most
    assert spare_node({0: 3, 1: 2, 2: 3}, [0, 1, 2], room={1: 2}) == 0
    assert spare_node({0: 3, 1: 2}, [0, 1], room={0: 3, 1: 2}) is None  # no room anywhere


def test_a_restart_places_the_groups_on_the_nodes_still_live():
    node_of, warning = on_live_nodes(6, 2, [0, 2])  # node 1 was lost
    assert set(node_of) == {0, 2} and node_of.count(0) == node_of.count(2) == 3
    assert warning is None  # 6 groups at r=2 on 2 nodes: still safe
    node_of, warning = on_live_nodes(4, 2, [3])  # one node left: every group there
    assert node_of == [3, 3, 3, 3] and "it takes 2 nodes" in warning
    with pytest.raises(ValueError, match="every node was lost"):
        on_live_nodes(6, 2, [])


def test_a_restart_with_no_live_node_left_is_refused_with_the_way_on():
    assert no_node_left([2]) is None and no_node_left(iter([0, 1])) is None
    why = no_node_left([])
    assert why.startswith("every node was lost") and "--resume" in why
    assert no_node_left(iter(())) == why  # any iterable, read once


def test_room_names_the_node_whose_slots_the_placement_overfills():
    node_of, _ = place_groups(6, 2, 3)  # two groups a node
    assert check_room(node_of, 2, {0: 2, 1: 2, 2: None}, {0: 1, 1: 1, 2: 0}) is None
    why = check_room(node_of, 0, {0: 2, 1: 1, 2: 2}, {0: None, 1: None, 2: None})
    assert why.startswith("node 1: --slots 1 but the placement puts 2 groups there")
    why = check_room(node_of, 3, {0: None, 1: None, 2: None}, {0: 1, 1: 1, 2: 0})
    assert why.startswith("3 warm spares but the nodes' --spares add up to 2")
    # an agent without --spares takes any number
    assert check_room(node_of, 3, {0: None, 1: None, 2: None}, {0: 1, 1: None, 2: 0}) is None


def test_gloo_binds_the_interface_that_holds_the_address_the_coordinator_is_reached_from():
    addrs = {"lo": "127.0.0.1", "eth0": "10.0.0.5", "ib0": "192.168.1.5"}
    assert gloo_interface(addrs, "192.168.1.5")[0] == "ib0"
    assert gloo_interface(addrs, "127.0.0.1")[0] == "lo"  # local nodes
    name, why = gloo_interface(addrs, "172.16.0.1")
    assert name is None and "gloo picks by the host name" in why


def test_a_fenced_node_comes_back_when_its_agent_asked_and_beats_again():
    fenced_at = {1: 40, 2: 17}
    # 1 asked and beat on since its fence; 2 asked but its counter stands (a stale request);
    # 3 asked but was never fenced
    back, why = rejoining([1, 2, 3], fenced_at, {1: 45, 2: 17, 3: 99})
    assert back == [1] and "take spares" in why
    assert rejoining([], fenced_at, {1: 45})[0] == []  # beating is not asking


def test_run_warns_when_its_local_nodes_cannot_keep_a_node_loss_safe():
    from unbroken.supervise.spec import JobSpec, node_warning

    assert node_warning(JobSpec(trainer="mlp", groups=6, local_nodes=3)) is None
    warn = node_warning(JobSpec(trainer="mlp", groups=4, local_nodes=1))
    assert "it takes 2 nodes" in warn


def test_a_healthy_node_has_no_problems_and_a_missing_signal_is_not_judged():
    assert health_problems({"mem_avail_mb": 9000, "mem_total_mb": 16000, "disk_free_mb": 5e4,
                            "load1": 3.0, "cpus": 2}) == []
    assert health_problems({}) == []


def test_memory_disk_and_load_problems_each_name_their_numbers():
    got = dict(health_problems({"mem_avail_mb": 700, "mem_total_mb": 16000,
                                "disk_free_mb": 512, "load1": 9.0, "cpus": 4}))
    assert set(got) == {"memory", "disk", "load"}
    assert "700 MiB of 16000 MiB" in got["memory"] and "512 MiB free" in got["disk"]
    assert "load 9.0 on 4 CPUs" in got["load"]
    # the bars are the policy's: just inside each one, nothing
    p = HealthPolicy(min_mem_frac=0.04, min_disk_mb=500, max_load_per_cpu=2.25)
    assert health_problems({"mem_avail_mb": 700, "mem_total_mb": 16000, "disk_free_mb": 512,
                            "load1": 9.0, "cpus": 4}, p) == []


def test_watch_beat_cuts_off_after_one_beat_in_flight_for_cut_after_seconds_of_ticks():
    from unbroken.core.nodes import BeatWatch, watch_beat

    s, why = watch_beat(BeatWatch(), calls=1, busy=True, period=0.5, cut_after=1.5)
    assert why is None and s == BeatWatch(1, 0)  # first sight of this beat: not yet counted
    for ticks in (1, 2):
        s, why = watch_beat(s, calls=1, busy=True, period=0.5, cut_after=1.5)
        assert why is None and s.ticks == ticks
    s, why = watch_beat(s, calls=1, busy=True, period=0.5, cut_after=1.5)
    assert why == "a heartbeat to the coordinator blocked for 1.5s" and s.ticks == 3


def test_watch_beat_resets_when_a_beat_returns_or_a_new_one_starts():
    from unbroken.core.nodes import BeatWatch, watch_beat

    s = BeatWatch(seen=4, ticks=5)
    assert watch_beat(s, calls=5, busy=True, period=0.5, cut_after=3.0) == (BeatWatch(5, 0),
                                                                           None)
    assert watch_beat(s, calls=4, busy=False, period=0.5, cut_after=3.0) == (BeatWatch(4, 0),
                                                                            None)
    for period, cut_after in ((0.0, 3.0), (0.5, 0.0), (0.5, -1.0)):
        with pytest.raises(ValueError, match="must be > 0"):
            watch_beat(s, calls=4, busy=True, period=period, cut_after=cut_after)


_QUIET = {"load1": 1.0, "cpus": 2, "mem_avail_mb": 12000, "mem_total_mb": 16000}


def test_a_node_above_its_peers_is_named_with_its_numbers_and_a_quieter_one_is_not():
    from unbroken.core.nodes import peer_health

    nodes = {n: dict(_QUIET, load1=1.0 + 0.05 * n) for n in range(5)}
    assert peer_health(nodes)[0] == {}
    nodes[3] = dict(_QUIET, load1=4.0)                       # 2.0 per CPU against ~0.55
    nodes[1] = dict(_QUIET, load1=0.0)                       # idle: below, never a problem
    above, why = peer_health(nodes)
    assert list(above) == [3] and set(above[3]) == {"load_per_cpu"} and above[3]["load_per_cpu"] > 4
    assert "node 3: load_per_cpu 2.00" in why and "other 4 nodes" in why


def test_peer_health_needs_three_peers_and_a_gap_that_matters():
    from unbroken.core.nodes import peer_health

    three = {0: _QUIET, 1: _QUIET, 2: dict(_QUIET, mem_avail_mb=800)}
    assert peer_health(three)[0] == {}                       # two peers: not enough to judge
    four = {**three, 3: _QUIET}
    assert set(peer_health(four)[0][2]) == {"mem_used_frac"}  # 95 % used against 25 %
    # a large z on a small absolute gap (0.1 runnable per CPU more than idle peers) is noise
    idle = {n: dict(_QUIET, load1=0.02) for n in range(4)}
    idle[0] = dict(_QUIET, load1=0.2)
    assert peer_health(idle)[0] == {}


def test_a_sample_with_a_broken_value_leaves_that_signal_out():
    from unbroken.core.nodes import health_signals, peer_health

    assert health_signals({"load1": float("nan"), "cpus": 2, "mem_avail_mb": "?",
                           "mem_total_mb": 100}) == {}
    nodes = {n: dict(_QUIET) for n in range(4)}
    nodes[1] = dict(_QUIET, load1=float("inf"))
    assert peer_health(nodes)[0] == {}  # judged without node 1's load, no exception
