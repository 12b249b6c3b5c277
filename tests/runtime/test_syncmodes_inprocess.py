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
from unbroken.runtime.syncmodes import ModeRunner  # noqa: E402
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


def _job(cfg, stores, delay) -> Job:
    # every gradient takes 10 ms more (a step the load of a shared 2-core machine does not
    # drown), the straggler's ``delay(step)``
    def prepare(u, runner):
        runner.trainer = Sleepy(runner.trainer, delay if u == SLOW else lambda s: BASE)
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
def test_auto_switches_to_mask_and_back_to_sync_when_the_straggler_recovers(reference,
                                                                           stores):
    until = 10  # slow for steps < 10, then as fast as the others
    job = _job(replace(CFG, sync="auto"), stores, lambda s: 0.05 if s < until else BASE)
    assert job.error == {}
    for u in job.uids:
        assert max_diff(job.result[u], reference) < 1e-9, u
    job.ledger_ok()
    switches = job.events(0, "mode_switch")
    # the load of a shared machine can make a fast group look slow for a window, so more
    # switches may happen; the first goes to mask while the straggler is slow, the last back
    # to sync after it recovered
    on, off = switches[0], switches[-1]
    assert (on["from"], on["to"]) == ("sync", "mask") and off["to"] == "sync", switches
    assert on["step"] < until <= off["step"]
    # the journal line carries the reason and every mode's predicted TTA
    assert "mask" in on["reason"] and set(on["predicted"]) >= {"sync", "mask", "ksync",
                                                                "groups", "async"}
    assert on["predicted"]["mask"] < on["predicted"]["sync"]
    assert "no straggler" in off["reason"] or "no mode beats sync" in off["reason"], off
    # a benched group is probed every PROBE steps: that is how the recovery was seen (how
    # soon depends on the probes passing the 1.1x release bar on a loaded machine)
    assert off["step"] < CFG.steps
    modes = [e["sync"] for e in job.events(SLOW, "commit")]
    assert modes[-1] == "sync" and "mask" in modes
    assert all(_untimed(job.events(u, "mode_switch")) == _untimed(switches) for u in job.uids)


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


def test_ksync_journals_the_mean_loss_of_the_shards_it_computed(stores):
    # the committed loss is the mean over the step's own shards (a sum over N - 1 divided by
    # N read 25 % low at N = 4 and made ksync look like it reached a target loss 10x sooner)
    job = _job(replace(CFG, sync="ksync:3", steps=12), stores, lambda s: 0.05)
    sync = _job(replace(CFG, sync="mask", steps=12), stores, lambda s: 0.0)
    lk = [e["loss"] for e in job.events(0, "commit")]
    ls = [e["loss"] for e in sync.events(0, "commit")]
    assert abs(sum(lk) / len(lk) - sum(ls) / len(ls)) < 0.1 * abs(sum(ls) / len(ls)), (lk, ls)
