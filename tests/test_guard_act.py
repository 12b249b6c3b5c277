"""The acting guard: runtime incidents, replays and XID lines in, ladder decisions journaled and
orders out (the launcher carries them out; tests/runtime/test_incidents.py and the chaos run
check that the runtime does what the orders say)."""

from __future__ import annotations

from unbroken.core.actions import Evict, PostCode, PostVerdict, Replace, Respawn
from unbroken.core.ladder import LadderPolicy
from unbroken.guard import Guard


def make(act=True, **kw):
    out: list[dict] = []
    return Guard(out.append, act=act, base_model="mlp", ckpt_every=10, **kw), out


def commits(g: Guard, upto: int, t0: float = 100.0) -> None:
    for k in range(upto):
        g.on_commit({"event": "commit", "step": k, "loss": 2.0, "t": t0 + k * 0.1}, uid=0)


def incident(kind, step, n=0, **extra):
    return {"event": "incident", "kind": kind, "step": step, "n": n, "members": [0, 1, 2, 3],
            "t": 200.0, **extra}


def test_nan_retries_in_place_once_then_escalates():
    g, out = make()
    commits(g, 5)
    g.on_incident(incident("implicit", 5, nonfinite=1), 200.1)
    g.on_incident(incident("implicit", 5, nonfinite=1), 200.1)  # a second member: same answer
    assert g.orders == [PostVerdict("verdict/5/0", {"action": "retry"})]
    (lad,) = [e for e in out if e["event"] == "ladder"]
    assert lad["rung"] == "retry" and lad["mode"] == "act"
    (res,) = [e for e in out if e["event"] == "resolved"]
    assert res["incident"] == "implicit" and res["detected_t"] == 200.0
    g.orders.clear()
    for n in (1, 2):  # the NaN keeps coming back in the same incident: retry, then replay
        g.on_incident(incident("implicit", 5, n=n, nonfinite=1), 200.2)
    assert [o.verdict["action"] for o in g.orders] == ["retry", "replay"]


def test_a_bad_update_is_applied_lazily_or_at_its_deadline_and_rolled_back():
    g, out = make(policy=LadderPolicy(update_deadline=5.0))
    commits(g, 3)
    g.queue_update("v1", "pkg:bad", 100.0)
    g.poll(104.0)
    assert g.orders == []  # waits for the next restart
    g.poll(105.5)  # forced after the deadline
    assert g.orders == [PostCode(1, {"version": "v1", "model": "pkg:bad"})]
    g.orders.clear()
    g.on_incident(incident("code", 3, errors=4, version="v1"), 106.0)
    assert g.orders == [PostCode(2, {"version": "v0", "model": "mlp"}),
                        PostVerdict("verdict/3/0", {"action": "retry", "code": 2})]
    lad = [e for e in out if e["event"] == "ladder"]
    assert lad[-1]["rung"] == "rollback" and "v1 -> v0" in lad[-1]["reason"]
    assert g.state.running == "v0" and "v1" in g.state.rejected


def test_a_queued_update_rides_along_with_the_next_retry():
    g, _ = make()
    commits(g, 3)
    g.queue_update("v1", "pkg:new", 100.0)
    g.on_incident(incident("implicit", 3, nonfinite=2), 101.0)
    assert g.orders == [PostCode(1, {"version": "v1", "model": "pkg:new"}),
                        PostVerdict("verdict/3/0", {"action": "retry", "code": 1})]


def test_sdc_mismatch_replays_then_evicts_the_majority_outlier_and_restores_verified():
    g, out = make()
    commits(g, 25)
    for k in (9, 19):
        g.on_check({"event": "sdc_check", "step": k, "ok": True})
        g.on_checkpoint({"event": "checkpoint", "step": k + 1, "t": 150.0})
    g.on_incident(incident("sdc", 24, mismatch={"1": {"1": 5, "2": 6},
                                                "2": {"2": 7, "3": 8}}), 300.0)
    assert g.orders == [PostVerdict("verdict/24/0", {"action": "replay", "types": [1, 2]})]
    g.orders.clear()
    g.on_replay({"event": "replay", "step": 24, "n": 0, "t": 300.2,
                 "uids": {"0": 0, "1": 1, "2": 6, "3": 3},  # slot 2 is held by spare uid 6
                 "digests": {"1": {"0": 5, "1": 5, "2": 9, "3": 5},
                             "2": {"0": 7, "1": 7, "2": 1, "3": 7}}}, 300.3)
    # proven corrupt: evicted at once; no warm spare in the pool, so the slot stays masked
    assert g.orders == [Evict(6, "replay"),
                        PostVerdict("verdict/24/1", {"action": "restore", "step": 20})]
    res = [e for e in out if e["event"] == "resolved"][-1]
    assert res["incident"] == "sdc" and res["restart"] and "[6]" in res["how"]
    assert any(e["event"] == "restart" and e["step"] == 20 and e["incident"] == "sdc"
               for e in out)


def test_an_inconclusive_replay_names_nobody_and_rolls_back():
    g, _ = make()
    commits(g, 15)
    g.on_check({"event": "sdc_check", "step": 9, "ok": True})
    g.on_checkpoint({"event": "checkpoint", "step": 10, "t": 150.0})
    g.on_replay({"event": "replay", "step": 14, "n": 0, "uids": {"0": 0, "1": 1},
                 "digests": {"1": {"0": 5, "1": 9}}}, 300.0)
    assert not [o for o in g.orders if isinstance(o, Evict)]
    assert g.orders[-1] == PostVerdict("verdict/14/1", {"action": "restore", "step": 10})


def test_a_restore_goes_to_a_checkpoint_on_disk_not_to_a_verified_step_never_saved():
    # the soak beside a busy loop (issue 28; 4 of 14 runs): rank 0, the slow group, was evicted
    # while it wrote step 20's checkpoint; step 19's check had verified it, the guard ordered a
    # restore to it, and every member waited for it in vain (exit 6)
    g, out = make()
    commits(g, 30)
    g.on_checkpoint({"event": "restore", "step": 0, "source": "none", "t": 99.0})
    for k in (9, 19):
        g.on_check({"event": "sdc_check", "step": k, "ok": True})
    g.on_checkpoint({"event": "checkpoint", "step": 10, "t": 150.0})
    g.on_replay({"event": "replay", "step": 29, "n": 0, "uids": {"0": 0, "1": 1},
                 "digests": {"1": {"0": 5, "1": 9}}}, 300.0)
    assert g.orders[-1] == PostVerdict("verdict/29/1", {"action": "restore", "step": 10})
    assert [e["step"] for e in out if e["event"] == "restart"] == [10]
    # a checkpoint loaded is on disk too (a resumed job's); none known: the seeded start
    g, _ = make()
    commits(g, 30)
    g.on_checkpoint({"event": "restore", "step": 20, "source": "checkpoint", "t": 99.0})
    g.on_replay({"event": "replay", "step": 29, "n": 0, "uids": {"0": 0, "1": 1},
                 "digests": {"1": {"0": 5, "1": 9}}}, 300.0)
    assert g.orders[-1] == PostVerdict("verdict/29/1", {"action": "restore", "step": 20})
    g, _ = make()
    commits(g, 30)
    g.on_check({"event": "sdc_check", "step": 19, "ok": True})
    g.on_replay({"event": "replay", "step": 29, "n": 0, "uids": {"0": 0, "1": 1},
                 "digests": {"1": {"0": 5, "1": 9}}}, 300.0)
    assert g.orders[-1] == PostVerdict("verdict/29/1", {"action": "restore", "step": 0})


def test_a_ladder_with_no_rung_left_stops_the_job():
    g, out = make(policy=LadderPolicy(max_attempts={"retry": 0, "rollback": 0, "replay": 0,
                                                    "restart": 0, "requeue": 0}))
    g.on_incident(incident("implicit", 2, nonfinite=1), 10.0)
    (o,) = g.orders
    assert o.key == "verdict/2/0" and o.verdict["action"] == "stop"
    assert [e for e in out if e["event"] == "ladder"][-1]["exit_code"] == 6


def test_xid_classes_map_to_respawn_in_place_or_evict(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    g, out = make(xid_log=str(log), standby=lambda: 2, uid_of_pid={4242: 1, 5151: 3}.get)
    log.write_text("NVRM: Xid (PCI:0000:02:00): 43, pid=4242, name=python, Ch 00000010\n")
    g.poll(50.0)
    log.write_text(log.read_text()
                   + "NVRM: Xid (PCI:0000:04:00): 79, pid=5151, name=python, GPU has fallen "
                     "off the bus.\n")
    g.poll(51.0)
    # restart-app: a fresh process in the same slot; fell off the bus: evicted, a spare in
    assert g.orders == [Evict(1, "xid"), Respawn(1), Evict(3, "xid"), Replace(3)]
    rungs = [(e["rung"], e["groups"]) for e in out if e["event"] == "ladder"]
    assert rungs == [("retry", [1]), ("evict", [3])]


def test_log_only_guard_decides_but_orders_nothing():
    g, out = make(act=False)
    g.on_incident(incident("implicit", 2, nonfinite=1), 10.0)
    g.on_incident(incident("sdc", 3, mismatch={"0": {"0": 1, "1": 2}}), 11.0)
    assert g.orders == []
    assert [e["mode"] for e in out if e["event"] == "ladder"] == ["log-only", "log-only"]
    assert not [e for e in out if e["event"] == "resolved"]


def test_health_outlier_must_persist_three_rounds_and_is_reported_once():
    g, out = make(act=False)

    def round_(t, rss_of_2):
        for u in range(4):
            g.on_health({"event": "health", "t": t, "cpu_util": 0.9 + 0.01 * u,
                         "rss_mb": rss_of_2 if u == 2 else 380.0 + u, "threads": 3 + (u == 0)},
                        uid=u)
        g.poll(t, live={0, 1, 2, 3})

    round_(10.0, 2000.0)
    round_(11.0, 2000.0)
    round_(12.0, 381.0)   # back to normal: the count starts over
    for t in (13.0, 14.0):
        round_(t, 2400.0)
    assert not [e for e in out if e["event"] == "alert"]
    for t in (15.0, 16.0, 17.0):
        round_(t, 2800.0)
    (alert,) = [e for e in out if e["event"] == "alert"]
    assert alert["how"] == "health" and alert["group"] == 2 and alert["signals"]["rss_mb"] > 4
    assert g.orders == []  # log-only: an alert, never an action


def test_an_incident_the_guard_cannot_read_stops_the_members_instead_of_leaving_them_waiting():
    g, out = make()
    g.on_incident(incident("gremlins", 4), 10.0)
    assert g.orders[0].key == "verdict/4/0" and g.orders[0].verdict["action"] == "stop"
    assert [e["detector"] for e in out if e["event"] == "detector_warning"] == ["incident"]
    g.on_replay({"event": "replay", "step": 5, "n": 0, "digests": "garbage"}, 11.0)
    assert g.orders[-1].key == "verdict/5/1" and g.orders[-1].verdict["action"] == "stop"


def test_a_fail_slow_eviction_waits_for_a_replay_in_flight():
    """A replay collects every member's digests; evicting a slow group meanwhile left the
    soak's vote at "1/1 agree -> no culprit". The verdict comes once the replay is answered."""
    g, out = make()
    for k in range(80):  # 8 s of steps: group 3 at 3x its peers' compute
        for u in range(4):
            g.on_commit({"event": "commit", "step": k, "loss": 2.0, "t": 100.0 + 0.1 * k,
                         "compute_s": 0.3 if u == 3 else 0.1}, uid=u)
    for k in (9, 19):
        g.on_check({"event": "sdc_check", "step": k, "ok": True})
    g.on_incident(incident("sdc", 24, mismatch={"1": {"1": 5, "2": 6}}), 107.0)
    g.poll(108.0)  # five slow rounds are closed, but a replay is in flight
    g.poll(109.9)  # more rounds closed, the replay still open: still held, not said again
    assert not [e for e in out if e.get("how") == "fail-slow"]
    (w,) = [e for e in out if e["event"] == "detector_warning"]  # said once, with the reason
    assert w["detector"] == "fail-slow" and "vote short of a majority" in w["message"]
    g.on_replay({"event": "replay", "step": 24, "n": 0, "t": 108.1, "uids": {str(u): u for u in
                 range(4)}, "digests": {"1": {"0": 5, "1": 5, "2": 9, "3": 5}}}, 110.0)
    g.poll(110.1)
    assert [e["group"] for e in out if e.get("how") == "fail-slow"] == [3]
    g2, out2 = make()  # the same rounds without a replay: flagged at the first poll
    for k in range(80):
        for u in range(4):
            g2.on_commit({"event": "commit", "step": k, "loss": 2.0, "t": 100.0 + 0.1 * k,
                          "compute_s": 0.3 if u == 3 else 0.1}, uid=u)
    g2.poll(108.0)
    assert [e["group"] for e in out2 if e.get("how") == "fail-slow"] == [3]


def test_an_eviction_is_journaled_as_exclusions_and_a_standby_restores_them(tmp_path):
    """The eviction history is durable state (recorded in etcd from the journal): a guard that
    takes the job over quarantines the nodes its predecessor quarantined."""
    from unbroken.core.ladder import quarantined

    log = tmp_path / "kern.log"
    log.write_text("")
    policy = LadderPolicy()
    g, out = make(xid_log=str(log), standby=lambda: 2, uid_of_pid={5151: 3}.get, policy=policy)
    for k, t in enumerate((51.0, 52.0, 53.0)):  # three fell-off-the-bus: quarantined
        log.write_text(log.read_text() + f"NVRM: Xid (PCI:0000:04:00): 79, pid=5151, "
                                         f"name=python, GPU has fallen off the bus. {k}\n")
        g.poll(t)
    said = [e for e in out if e["event"] == "exclusions"]
    assert said and said[-1]["exclusions"]["3"]["quarantines"] == 1, said
    assert quarantined(g.state, policy, 60.0) == {3}

    h, out2 = make(policy=policy)  # the standby's guard, from what etcd kept
    assert quarantined(h.state, policy, 60.0) == frozenset()
    h.restore_exclusions(said[-1]["exclusions"])
    assert quarantined(h.state, policy, 60.0) == {3}
    assert out2[-1]["event"] == "exclusions" and out2[-1]["restored"] is True
