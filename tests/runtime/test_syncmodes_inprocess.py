"""``--sync mask`` and ``--sync auto`` in one process (threads over the fake communicator of
``fakecomm``): a group that sleeps in its gradient is left out of the step like a failed one,
its shard types go to their other hosts, the parameters stay those of the synchronous run
(up to float summation order), every sample counts exactly once, and the group comes back
when it is fast again. Not ``mp``; the sleeps are the injected slowness, never a
synchronisation."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from fakecomm import StorePool  # noqa: E402
from test_runner_inprocess import Job, max_diff  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.syncmodes import AUTO_MODES, BLOCKED_WINDOW, PROBE, ModeRunner  # noqa: E402
from unbroken.runtime.trainer import reference_run  # noqa: E402
from unbroken.testing.faults import TrainerProxy  # noqa: E402

CFG = TrainConfig(groups=4, redundancy=2, steps=24, seed=3)
SLOW = 1  # the straggler's uid (= slot)
BASE = 0.01


@pytest.fixture(scope="module")
def stores() -> StorePool:
    return StorePool()


@pytest.fixture(scope="module")
def reference() -> torch.Tensor:
    return reference_run(CFG)


class Sleepy(TrainerProxy):
    """A trainer whose gradient at step s takes ``delay(s)`` seconds longer (a slow machine)."""

    def __init__(self, inner, delay) -> None:
        super().__init__(inner)
        self.delay = delay

    def grad(self, step, shard_type, out=None):
        g = super().grad(step, shard_type, out)
        time.sleep(self.delay(step))
        return g


def _untimed(evs: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "t"} for e in evs]


def _job(cfg, stores, delay, base: float = BASE) -> Job:
    # every gradient takes 10 ms more (a step the load of a shared 2-core machine does not
    # drown), the straggler's ``delay(step)``
    def prepare(u, runner):
        runner.trainer = Sleepy(runner.trainer, delay if u == SLOW else lambda s: base)
    return Job(cfg, stores, prepare=prepare, runner=ModeRunner).run()


@pytest.mark.timeout(60)
def test_mask_benches_a_persistent_straggler_and_keeps_the_sync_gradient(reference, stores):
    job = _job(replace(CFG, sync="mask"), stores, lambda s: 0.05)
    assert job.error == {}
    for u in job.uids:  # the synchronous trajectory, up to the order of a float sum
        assert max_diff(job.result[u], reference) < 1e-9, u
    job.ledger_ok()
    benches = job.events(0, "bench")
    assert benches and benches[0]["bench"] == [SLOW], benches
    first = benches[0]["step"]  # the step a bench applies to
    commits = job.commits(SLOW)
    # left out: from the first benched step on it contributes nothing, and stays out
    assert all(commits[k]["mine"] == [] and commits[k]["sync"] == "mask"
               for k in range(first, CFG.steps)), [commits[k]["mine"] for k in commits]
    assert all(commits[k]["sync"] == "sync" for k in range(first))
    # its types went to their other hosts: each step's plan has every type exactly once
    for k in range(first, CFG.steps):
        plan = job.commits(0)[k]["plan"]
        assert sorted(plan) == ["0", "1", "2", "3"] and SLOW not in plan.values()
    # every member took the same decisions at the same boundaries
    assert all(_untimed(job.events(u, "bench")) == _untimed(benches) for u in job.uids)


@pytest.mark.timeout(60)
def test_auto_leaves_sync_for_the_mode_it_predicts_soonest_and_comes_back(stores):
    until = 10  # slow for steps < 10, then as fast as the others
    # 32 steps: a recovery is seen by the straggler's probes (every PROBE = 8 steps), and the
    # first one after it may still read over 1.1x the fastest on a loaded machine
    cfg = replace(CFG, sync="auto", steps=32)
    job = _job(cfg, stores, lambda s: 0.05 if s < until else BASE)
    assert job.error == {}
    job.ledger_ok()  # also when it chose ksync: the backlog is drained when it leaves it
    for u in job.uids:
        assert max_diff(job.result[u], job.result[0]) == 0.0
    switches = job.events(0, "mode_switch")
    # the load of a shared machine can make a fast group look slow for a window, so more
    # switches may happen; the first leaves sync while the straggler is slow, the last comes
    # back after it recovered
    on, off = switches[0], switches[-1]
    assert on["from"] == "sync" and on["to"] != "sync" and off["to"] == "sync", switches
    assert on["step"] < until <= off["step"] < cfg.steps
    # the journal line carries the reason and every mode's predicted TTA, and the mode
    # chosen is the one predicted soonest of those auto runs
    pred = on["predicted"]
    assert set(pred) >= {"sync", "mask", "ksync", "groups", "async"}
    chosen = on["to"].partition(":")[0]
    assert chosen in on["reason"] and pred[chosen] == min(pred[m] for m in AUTO_MODES), on
    # a 5x straggler: sync waits 5x, mask stacks 2 deep, ksync:3 costs 4/3 of a shard
    assert on["to"] == "ksync:3" and "cores" not in on, on
    assert "no straggler" in off["reason"] or "no mode beats sync" in off["reason"], off
    modes = [e["sync"] for e in job.events(SLOW, "commit")]
    assert modes[-1] == "sync" and any(m.startswith("ksync") for m in modes)
    assert all(_untimed(job.events(u, "mode_switch")) == _untimed(switches) for u in job.uids)


@pytest.mark.timeout(60)
def test_auto_sees_a_group_start_to_sleep_within_a_few_steps(stores):
    # from step 10 on group 1 sleeps 50 ms a gradient (a machine that became slow): blocked
    # time is exact, so its prediction follows in BLOCKED_WINDOW (3) measurements and auto
    # leaves sync 2 decisions later, not after the 15-measurement window of the on-core part
    start = 10
    cfg = replace(CFG, sync="auto", steps=22)
    job = _job(cfg, stores, lambda s: 0.05 if s >= start else BASE)
    assert job.error == {}, job.error
    job.ledger_ok()
    on = job.events(0, "mode_switch")[0]
    assert on["from"] == "sync" and on["to"] != "sync", on
    assert start + BLOCKED_WINDOW <= on["step"] <= start + BLOCKED_WINDOW + 3, on
    assert on["times"][SLOW] > 3 * min(on["times"]), on  # 60 ms against 10 and the compute


@pytest.mark.timeout(60)
def test_auto_prices_groups_sharing_cores_at_the_contention_each_mode_leaves(stores):
    # the same 5x straggler, the 4 groups on 2 cores (what the supervisor sets when a
    # machine's groups outnumber its cores): ksync:2 computes 2 shards a group at full speed,
    # ksync:3 4/3 shards a group at 1.5x contention (no faster) with a varying batch. 30 ms
    # a gradient: at 10 ms a loaded machine's few ms of on-core noise can make one fast
    # group read 2x another early on, and ksync:1 (the fastest alone, 4 shards) then looks
    # as fast
    job = _job(replace(CFG, sync="auto", host_cores=2, steps=12), stores, lambda s: 0.15,
               base=0.03)
    assert job.error == {}, job.error
    job.ledger_ok()
    on = job.events(0, "mode_switch")[0]
    assert on["from"] == "sync" and on["to"] == "ksync:2" and on["cores"] == 2, on
    assert on["predicted"]["ksync"] < on["predicted"]["sync"]


@pytest.mark.timeout(60)
def test_ksync_defers_the_straggler_and_uses_every_sample_exactly_once(stores):
    cfg = replace(CFG, sync="ksync:3")
    job = _job(cfg, stores, lambda s: 0.05)
    assert job.error == {}, job.error
    job.ledger_ok()  # every (step, type) once: deferred shards counted at their data step
    commits = job.commits(0)
    deferred = {k: c["deferred"] for k, c in commits.items() if c.get("deferred")}
    caught = [tuple(x[:2]) for c in commits.values() for x in c.get("catch_up", [])]
    assert deferred and all(v == [SLOW] for v in deferred.values()), deferred
    assert sorted(caught) == sorted((k, t) for k, ts in deferred.items() for t in ts)
    # the straggler contributes nothing while deferred; the last step defers nothing
    assert commits[CFG.steps - 1].get("deferred", []) == []
    assert all(job.commits(SLOW)[k]["mine"] == [] for k in deferred)
    # not the synchronous trajectory (the data order changes), but every member's the same
    for u in job.uids:
        assert max_diff(job.result[u], job.result[0]) == 0.0
    assert all(_untimed(job.events(u, "bench")) == _untimed(job.events(0, "bench"))
               for u in job.uids)


@pytest.mark.timeout(60)
def test_only_a_straggler_left_out_probes_not_a_fast_group_ksync_defers(stores):
    # ksync:2 defers the straggler and one fast group; probing costs a shard's compute,
    # which groups sharing cores pay, so only the straggler computes for the clock
    # 30 ms a gradient: a fast group must not read 1.2x another's by the load's noise
    job = _job(replace(CFG, sync="ksync:2"), stores, lambda s: 0.15, base=0.03)
    assert job.error == {}, job.error
    job.ledger_ok()
    deferred = {k for k, c in job.commits(0).items() if c.get("deferred")}
    late = {u for u in job.uids if any(job.commits(u)[k]["mine"] == [] for k in deferred)}
    assert len(late) >= 2 and SLOW in late, late  # the fast one deferred may change
    probes = {u: sorted(k for k, c in job.commits(u).items() if "probe_s" in c)
              for u in job.uids}
    assert probes[SLOW] and all(k % PROBE == 0 for k in probes[SLOW]), probes
    # a fast group probes only when its own times flagged it (over 1.1x the fastest, the
    # release of the flag): a CI run's load once did for group 2 at step 16. Never for being
    # deferred: the prediction that flagged each probe is in its commit
    for u, steps in probes.items():
        for k in steps:
            times = job.commits(u)[k]["probe_times"]
            assert times[u] > 1.1 * min(times), (u, k, times)


def test_ksync_journals_the_mean_loss_of_the_shards_it_computed(stores):
    # the committed loss is the mean over the step's own shards (a sum over N - 1 divided by
    # N read 25 % low at N = 4 and made ksync look like it reached a target loss 10x sooner)
    job = _job(replace(CFG, sync="ksync:3", steps=12), stores, lambda s: 0.05)
    sync = _job(replace(CFG, sync="mask", steps=12), stores, lambda s: 0.0)
    lk = [e["loss"] for e in job.events(0, "commit")]
    ls = [e["loss"] for e in sync.events(0, "commit")]
    assert abs(sum(lk) / len(lk) - sum(ls) / len(ls)) < 0.1 * abs(sum(ls) / len(ls)), (lk, ls)


class Biased(Sleepy):
    """Shard type ``SLOW``'s loss reads ``BIAS`` higher (its samples are harder): a loss
    measured without that type reads BIAS / N low."""

    def grad(self, step, shard_type, out=None):
        g = super().grad(step, shard_type, out)
        if shard_type == SLOW:
            self.last_loss[shard_type] += BIAS
        return g


BIAS = 10.0


def _biased_job(cfg, stores, delay) -> Job:
    def prepare(u, runner):
        runner.trainer = Biased(runner.trainer, delay if u == SLOW else lambda s: BASE)
    return Job(cfg, stores, prepare=prepare, runner=ModeRunner).run()


@pytest.mark.timeout(60)
def test_ksync_data_step_loss_covers_every_shard_type_like_sync(stores):
    # the straggler's type is deferred on most steps; the loss TTA and the final loss are
    # judged by must still count it, as sync's does (its own-shard loss reads BIAS / 4 low)
    from unbroken.core.stragglers import data_step_loss_points

    ks = _biased_job(replace(CFG, sync="ksync:3"), stores, lambda s: 0.05)
    sy = _biased_job(replace(CFG, sync="mask"), stores, lambda s: 0.0)  # never benches
    assert ks.error == {} and sy.error == {}
    deferred = [k for k, c in ks.commits(0).items() if SLOW in c.get("deferred", [])]
    assert len(deferred) > CFG.steps // 2, deferred
    pk = data_step_loss_points(ks.events(0, "commit"))
    ps = data_step_loss_points(sy.events(0, "commit"))
    assert sorted(pk) == sorted(ps) == list(range(CFG.steps))  # every data step, once
    # a deferred step's loss is known (and timed) when its last shard is computed: later
    commit_t = {k: c["t"] for k, c in ks.commits(0).items()}
    assert all(pk[k][0] > commit_t[k] for k in deferred)
    assert all(pk[k][0] == commit_t[k] for k in range(CFG.steps) if k not in deferred)
    # the same samples as sync's step, on a trajectory that differs a little: the mean
    # difference is far below the BIAS / 4 that leaving the type out would make
    diff = [pk[k][1] - ps[k][1] for k in range(CFG.steps)]
    assert abs(sum(diff) / len(diff)) < 0.1 * BIAS / 4, diff
    own = [ks.commits(0)[k]["loss"] for k in deferred]  # the step's own shards only
    assert sum(ps[k][1] - o for k, o in zip(deferred, own)) / len(own) > 0.8 * BIAS / 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("die_at", [CFG.steps - 1, CFG.steps - 4],
                         ids=["dies-in-the-last-step", "down-at-the-last-step"])
def test_ksync_backlog_is_caught_up_when_a_group_dies_near_the_end(stores, die_at):
    # group 3 dies at its all-reduce of step die_at (the last step, or three before it: the
    # failure plan is in force at the last step). What the straggler deferred is caught up by
    # whoever is live in the re-planned step: every sample still exactly once.
    victim = 3
    cfg = replace(CFG, sync="ksync:3")

    def prepare(u, runner):
        runner.trainer = Sleepy(runner.trainer, (lambda s: 0.05) if u == SLOW
                                else (lambda s: BASE))
    job = Job(cfg, stores, hooks={victim: {"die_at_call": die_at}}, prepare=prepare,
              runner=ModeRunner).run()
    assert set(job.error) == {victim}, job.error
    commits = job.commits(0)
    assert any(c.get("deferred") for k, c in commits.items() if k < die_at)  # a backlog
    assert commits[die_at]["members"] == [0, 1, 2]
    caught = commits[die_at].get("catch_up", [])
    assert caught and all(u != victim for *_, u in caught), caught
    # nothing is deferred once a group is down, and nothing is left over at the end
    assert all(not commits[k].get("deferred") for k in range(die_at, cfg.steps))
    job.ledger_ok()
    for u in (0, 1, 2):
        assert max_diff(job.result[u], job.result[0]) == 0.0


def _delivered(job: Job) -> list[tuple[int, int, int, int, int]]:
    """(commit step, data step, type, group, staleness) of every shard a stream delivered."""
    return [(k, *d) for k, c in job.commits(0).items() for d in c.get("delivered", [])]


def _bg_checks(job: Job) -> None:
    assert job.error == {}, job.error
    job.ledger_ok()  # every (data step, type) exactly once, the last step's drain included
    last = job.commits(0)[CFG.steps - 1]
    assert last.get("in_flight", []) == [] and last["sync"] == "sync"
    for u in job.uids:  # every member committed the same deliveries and the same parameters
        assert [(k, c.get("delivered"), c.get("catch_up"), c["plan"])
                for k, c in job.commits(u).items()] == \
            [(k, c.get("delivered"), c.get("catch_up"), c["plan"])
             for k, c in job.commits(0).items()]
        assert max_diff(job.result[u], job.result[0]) == 0.0
    from unbroken.core.stragglers import data_step_loss_points
    assert sorted(data_step_loss_points(job.events(0, "commit"))) == list(range(CFG.steps))


@pytest.mark.timeout(60)
def test_async_delivers_a_stragglers_gradients_late_and_stale_each_shard_once(stores):
    from unbroken.core.sync import MAX_STALENESS

    job = _job(replace(CFG, sync="async"), stores, lambda s: 0.04)
    _bg_checks(job)
    d = _delivered(job)
    slow = [x for x in d if x[3] == SLOW]
    # the straggler's shards arrive after the step they were started on, at most the bound
    assert slow and all(1 <= x[4] <= MAX_STALENESS for x in slow), slow
    assert any(x[1] < x[0] for x in slow)  # its stream lags the step
    # a commit's update is a mean over what it summed: some steps go on without the
    # straggler (it is in flight), none waits for it past the bound
    inflight = [k for k, c in job.commits(0).items() if SLOW in c.get("in_flight", [])]
    assert len(inflight) > CFG.steps // 3, inflight
    assert all(x[4] <= MAX_STALENESS for x in d)


@pytest.mark.timeout(60)
def test_groups_cluster_members_deliver_together_and_the_fast_cluster_is_synchronous(stores):
    # two equally slow groups: one background cluster. 60 ms for the fast ones: the linkage
    # threshold is 10 % of the fastest, and a loaded machine's noise on the pair's background
    # jobs split it at 10 ms (3 of 8 runs under a busy loop) and at 30 ms (once in a suite)
    def prepare(u, runner):
        runner.trainer = Sleepy(runner.trainer, (lambda s: 0.24) if u in (1, 2)
                                else (lambda s: 0.06))
    job = Job(replace(CFG, sync="groups"), stores, prepare=prepare, runner=ModeRunner).run()
    _bg_checks(job)
    commits = job.commits(0)
    pairs = 0
    for k, c in commits.items():
        # (a unit may deliver within its own step, staleness 0: a group a loaded machine
        # made look slow at the first steps)
        stale = {x[2]: x for x in c.get("delivered", [])}
        for unit in c.get("units", []):
            # a unit's members all delivered in this commit, on the same parameter step
            assert all(g in stale for g in unit), (k, unit, c["delivered"])
            assert len({stale[g][3] for g in unit}) == 1, (k, unit, c["delivered"])
            pairs += sorted(unit) == [1, 2]
    assert pairs >= 2, [c.get("units") for c in commits.values()]
    # once clustered, the fast groups commit every step synchronously (staleness 0)
    assert sum(sorted(c["plan"]) == ["0", "3"] for c in commits.values()) > CFG.steps // 3


@pytest.mark.timeout(90)
def test_auto_with_the_ml_selector_lets_the_network_choose(stores, tmp_path):
    from unbroken.runtime import modelfile
    from unbroken.sync.selector import train_selector

    sel = train_selector(groups=4, n=100, seed=0, epochs=100, runtime=True)
    path = tmp_path / "selector.pt"
    modelfile.save(str(path), "selector", sel.state, sel.meta)
    until = 10  # 32 steps: the recovery is seen by probes every PROBE = 8 steps
    job = _job(replace(CFG, sync="auto", selector=str(path), steps=32), stores,
               lambda s: 0.05 if s < until else BASE)
    assert job.error == {}
    job.ledger_ok()
    switches = job.events(0, "mode_switch")
    on = switches[0]
    assert "ML selector" in on["reason"] and on["step"] < until, switches
    # the network's pick for what auto saw (the journal's predicted times and noise scale)
    phi = max(0.0, on["noise_scale"] or 0.0)
    assert on["to"] == sel.choose(on["times"], phi, AUTO_MODES)[0], on
    assert switches[-1]["to"] == "sync" and switches[-1]["step"] >= until
    assert all(_untimed(job.events(u, "mode_switch")) == _untimed(switches) for u in job.uids)
