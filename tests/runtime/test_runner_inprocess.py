"""StackedRunner in one process: N runners in N threads over a fake communicator.

The complement of ``test_stacked.py`` (real processes, gloo, SIGKILL): here the collective is
an in-memory rendezvous (``fakecomm.FakeGroup``) and the store a real TCPStore hosted by the
test, so the runner's step protocol (in-band check, re-plan, roll-forward, stop) runs in a
fraction of a second and every interleaving point is deterministic: a death is a hook in the
fake at a given all-reduce, never a signal, and nothing waits on a clock. Not ``mp``.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from fakecomm import FakeGroup, MemberDied, StorePool  # noqa: E402

from unbroken.core.shards import exactly_once  # noqa: E402
from unbroken.protocol import STOP_KEY, join_key  # noqa: E402
from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.core.ledger import DivergenceError, check_ledger, ledger_records  # noqa: E402
from unbroken.runtime.stacked import StackedRunner, StopRequested  # noqa: E402
from unbroken.runtime.trainer import grad_into, reference_run  # noqa: E402
from unbroken.runtime.hooks import StepHooks  # noqa: E402
from unbroken.testing.faults import (Faults, FaultSpec, FaultyTrainer, GradFaults,  # noqa: E402
                                     SelfFaults, TrainerProxy, build)

CFG = TrainConfig(groups=4, redundancy=2, steps=10, seed=3)
UIDS = list(range(CFG.groups))


@pytest.fixture(scope="module")
def reference() -> torch.Tensor:
    return reference_run(CFG)


@pytest.fixture(scope="module")
def stores() -> StorePool:
    """The module's one TCPStore server and its member clients (connected once)."""
    return StorePool()


class Job:
    """N runners over one FakeGroup, each in its own thread; collects journals and outcomes."""

    def __init__(self, cfg: TrainConfig, stores: StorePool,
                 hooks: dict[int, dict] | None = None,
                 on_event: Callable[[int, dict, Any], None] | None = None,
                 prepare: Callable[[int, StackedRunner], None] | None = None,
                 faults: dict[int, Faults] | None = None,
                 runner: Callable[..., StackedRunner] = StackedRunner,
                 spares: dict[int, tuple[int, Callable[[], None]]] | None = None,
                 step_hooks: dict[int, StepHooks] | None = None, offers: bool = True) -> None:
        """``spares``: uid -> (the slot it takes, what its thread waits for before it asks
        to join); ``step_hooks``: a member's StepHooks (faults' hooks otherwise);
        ``offers``: the communicators carry the settle reports with the rendezvous (as
        FTComm does; False: the settle's all-reduce fallback)."""
        self.cfg = cfg
        self.spares = dict(spares or {})
        self.uids = list(range(cfg.groups)) + sorted(self.spares)
        self.group = FakeGroup(self.uids[:cfg.groups], spares=sorted(self.spares),
                               stores=stores, offers=offers)
        self.comms = {u: self.group.comm(u, **(hooks or {}).get(u, {})) for u in self.uids}
        self.journals: dict[int, list[dict]] = {u: [] for u in self.uids}
        self.result: dict[int, torch.Tensor] = {}
        self.error: dict[int, BaseException] = {}
        self.runners: dict[int, StackedRunner] = {}
        for u in self.uids:
            def journal(ev: dict, u: int = u) -> None:
                self.journals[u].append(ev)
                if on_event is not None:
                    on_event(u, ev, self.comms[u])
            f = (faults or {}).get(u)  # a member's injected faults wrap its comm and trainer
            self.runners[u] = runner(cfg, u, f.comm(self.comms[u]) if f else self.comms[u],
                                     journal, hooks=(step_hooks or {}).get(u) or (
                                         f.hooks if f else None))
            if prepare is not None:
                prepare(u, self.runners[u])

    def _main(self, u: int) -> None:
        try:
            if u in self.spares:
                slot, ready = self.spares[u]
                ready()
                self.runners[u].join(slot, timeout=self.group.wait_s)
            self.result[u] = self.runners[u].run()
        except BaseException as exc:  # noqa: BLE001 - MemberDied included: the thread's end
            self.error[u] = exc
            if not isinstance(exc, MemberDied):
                # a runner that stops on its own must not leave its peers waiting in a round
                self.group.kill(u)

    def run(self, join_s: float = 30.0) -> Job:
        threads = [threading.Thread(target=self._main, args=(u,), name=f"group-{u}",
                                    daemon=True) for u in self.uids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(join_s)
            assert not t.is_alive(), f"{t.name} still running after {join_s}s"
        return self

    def events(self, u: int, kind: str) -> list[dict]:
        return [e for e in self.journals[u] if e["event"] == kind]

    def commits(self, u: int) -> dict[int, dict]:
        return {e["step"]: e for e in self.events(u, "commit")}

    def ledger_ok(self) -> None:
        rep = exactly_once(ledger_records(self.journals), self.cfg.steps, self.cfg.groups)
        assert rep.ok and rep.records == self.cfg.steps * self.cfg.groups, rep


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.timeout(60)
def test_failure_free_equals_reference_exactly_once(reference, stores):
    job = Job(CFG, stores).run()
    assert job.error == {}
    for u in UIDS:
        assert max_diff(job.result[u], reference) < 1e-12, u
        assert job.runners[u].step == CFG.steps
        commits = job.events(u, "commit")
        assert [e["step"] for e in commits] == list(range(CFG.steps))
        assert [e["mine"] for e in commits] == [[u]] * CFG.steps  # plain data parallelism
        assert {e["gen"] for e in commits} == {0}
        assert job.events(u, "replan") == []
        assert job.comms[u].calls == CFG.steps  # one all-reduce per step, nothing else
    job.ledger_ok()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("offers", [True, False], ids=["settle-with-rendezvous",
                                                       "settle-by-all-reduce"])
@pytest.mark.parametrize("after_send", [False, True], ids=["before-send", "after-send"])
def test_one_group_dies_at_step_4_is_masked(reference, stores, after_send, offers):
    # group 1 dies at its step-4 all-reduce. Before sending: step 4 fails everywhere and is
    # re-planned. After sending: its contribution completed step 4 (the survivors commit it
    # with type 1 from group 1, which never journals that commit) and step 5 is re-planned.
    # The settle's reports come with the rendezvous, or (a communicator without offer) by
    # one all-reduce: the same outcome, one collective more
    victim, at, survivors = 1, 4, [0, 2, 3]
    hooks = {victim: {"die_at_call": at, "die_after_send": after_send}}
    job = Job(CFG, stores, hooks=hooks, offers=offers).run()
    assert set(job.error) == {victim} and isinstance(job.error[victim], MemberDied)
    assert job.comms[victim].tensors[at][-1].item() == at  # call 4 was step 4's buffer
    assert [e["step"] for e in job.events(victim, "commit")] == list(range(at))
    k = at + 1 if after_send else at  # the step the survivors re-plan
    for u in survivors:
        assert max_diff(job.result[u], reference) < 1e-9, u
        (rp,) = job.events(u, "replan")
        assert rp["step"] == k and rp["members"] == survivors and rp["gen"] == 1
        # stacks are (w, w+1): type 1's other host is group 0, now at depth 2
        assert rp["depth"] == 2 and rp["patch"] == {"0": [1]}
        commits = job.commits(u)
        assert sorted(commits) == list(range(CFG.steps))
        assert commits[k - 1]["gen"] == 0 and commits[k - 1]["plan"]["1"] == victim
        assert commits[k]["gen"] == 1 and commits[k]["members"] == survivors
        assert commits[k]["plan"] == {"0": 0, "1": 0, "2": 2, "3": 3}
        assert commits[CFG.steps - 1]["mine"] == ([0, 1] if u == 0 else [u])
        # every step's all-reduce, the failed one, and the settle's unless it rode along
        assert job.comms[u].calls == CFG.steps + 1 + (0 if offers else 1)
    job.ledger_ok()


class _AwaitJoin(StepHooks):
    """A survivor's re-plan waits until the spare's join record is in the store, so the
    admission falls at a boundary with steps left instead of racing the run's end."""

    def after_replan(self, runner: StackedRunner, plan: Any) -> None:
        runner.comm.store.wait([join_key(1)], timedelta(seconds=20))


@pytest.mark.timeout(60)
def test_a_spare_takes_the_dead_groups_slot_and_every_member_ends_on_the_reference(
        reference, stores):
    victim, at, spare, survivors = 1, 3, 4, [0, 2, 3]
    replanned = threading.Event()

    def on_event(u: int, ev: dict, _comm: Any) -> None:
        if ev["event"] == "replan":
            replanned.set()

    job = Job(CFG, stores, hooks={victim: {"die_at_call": at}}, on_event=on_event,
              spares={spare: (victim, lambda: replanned.wait(20))},
              step_hooks={u: _AwaitJoin() for u in survivors}).run()
    assert set(job.error) == {victim}
    (joined,) = job.events(spare, "joined")
    k = joined["step"]
    assert joined["slot"] == victim and at < k < CFG.steps
    for u in survivors + [spare]:
        assert max_diff(job.result[u], reference) < 1e-9, u
    # from its admission on the spare commits every step, holding slot 1's types
    assert sorted(job.commits(spare)) == list(range(k, CFG.steps))
    last = job.commits(0)[CFG.steps - 1]
    assert sorted(last["members"]) == [0, 2, 3, spare] and last["mine"] == [0]
    job.ledger_ok()


@pytest.mark.timeout(60)
def test_a_wipe_out_admits_both_replacements_and_resumes_its_step_from_memory(reference,
                                                                             stores):
    # stacks are (w, w+1): groups 1 and 2 are type 2's only hosts, so losing both at the
    # same all-reduce leaves no plan; the survivors wait for replacements of slots 1 and 2
    at, spares, survivors = 3, {4: 1, 5: 2}, [0, 3]
    wiped = threading.Event()

    def on_event(u: int, ev: dict, _comm: Any) -> None:
        if ev["event"] == "wipeout":
            wiped.set()

    job = Job(CFG, stores, hooks={1: {"die_at_call": at}, 2: {"die_at_call": at}},
              on_event=on_event,
              spares={u: (slot, lambda: wiped.wait(20)) for u, slot in spares.items()}).run()
    assert set(job.error) == {1, 2}
    for u in survivors:
        (w,) = job.events(u, "wipeout")
        assert w["step"] == at and w["lost_types"] == [2] and w["dead_slots"] == [1, 2]
        (r,) = job.events(u, "restart")
        assert r["step"] == at and r["source"] == "memory"  # no step but the one in flight
    for u, slot in spares.items():
        (j,) = job.events(u, "joined")
        assert j["slot"] == slot and sorted(job.commits(u)) == list(range(at, CFG.steps))
    for u in survivors + sorted(spares):
        assert max_diff(job.result[u], reference) < 1e-9, u
    job.ledger_ok()


@pytest.mark.timeout(60)
def test_a_member_cut_off_as_its_op_completed_commits_an_orphan_the_ledger_drops(reference,
                                                                                  stores):
    # group 1's link goes down during step 4's all-reduce: its op completes (it commits step 4
    # with the old plan, alone), every other member's fails and re-plans step 4 without it.
    # Seen in the netns test as "step 9: groups committed different plans" from the ledger.
    victim, at, survivors = 1, 4, [0, 2, 3]
    job = Job(CFG, stores, hooks={victim: {"cut_at_call": at}}).run()
    assert set(job.error) == {victim} and isinstance(job.error[victim], MemberDied)
    orphan = job.commits(victim)[at]
    assert orphan["gen"] == 0 and orphan["plan"]["1"] == victim
    for u in survivors:
        assert max_diff(job.result[u], reference) < 1e-9, u
        (rp,) = job.events(u, "replan")
        assert rp["step"] == at and rp["members"] == survivors
        assert job.commits(u)[at]["plan"] == {"0": 0, "1": 0, "2": 2, "3": 3}
    job.ledger_ok()
    orphans: list = []
    rep, err = check_ledger(job.journals, CFG.steps, CFG.groups, orphans)
    assert rep.ok and err is None and orphans == [(at, victim)]
    # journaled the other way round (the orphan's line after the re-plan's) it is dropped too
    late = {**job.journals, victim: [dict(e, t=e["t"] + 60) if e is orphan else e
                                     for e in job.journals[victim]]}
    orphans = []
    assert exactly_once(ledger_records(late, orphans), CFG.steps, CFG.groups).ok
    assert orphans == [(at, victim)]
    # a survivor committing a different plan for the step is still a divergence
    bad = {**job.journals, 0: [dict(e, plan=orphan["plan"], mine=[0])
                               if e["event"] == "commit" and e["step"] == at else e
                               for e in job.journals[0]]}
    with pytest.raises(DivergenceError, match=f"step {at}: groups committed different plans"):
        ledger_records(bad)


@pytest.mark.timeout(60)
def test_stop_request_stops_every_member_after_the_same_step(stores):
    # the stop key is set while training, from group 2's thread right after it commits step 5
    # (rank 0 may or may not have read the control counters of step 6 by then); whichever
    # step's buffer carries the request, every member raises after committing that step
    def on_event(u: int, ev: dict, comm) -> None:
        if u == 2 and ev["event"] == "commit" and ev["step"] == 5:
            comm.store.add(STOP_KEY, 1)

    job = Job(CFG, stores, on_event=on_event).run()
    assert set(job.error) == set(UIDS) and job.result == {}
    assert all(isinstance(e, StopRequested) for e in job.error.values()), job.error
    last = {u: max(job.commits(u)) for u in UIDS}
    assert len(set(last.values())) == 1, last
    stop = last[0]
    assert 6 <= stop <= 7 and stop < CFG.steps - 1
    assert {job.runners[u].step for u in UIDS} == {stop + 1}
    assert all(f"after step {stop}" in str(e) for e in job.error.values())
    rep = exactly_once(ledger_records(job.journals), stop + 1, CFG.groups)
    assert rep.ok and rep.records == (stop + 1) * CFG.groups, rep


@pytest.mark.timeout(60)
def test_stop_request_read_by_rank_0_stops_after_the_next_step(stores):
    # deterministic variant: rank 0 (group 0) sets the key from its own commit of step 5, so
    # it reads it into step 6's buffer: every member commits step 6, then stops
    def on_event(u: int, ev: dict, comm) -> None:
        if u == 0 and ev["event"] == "commit" and ev["step"] == 5:
            comm.store.add(STOP_KEY, 1)

    job = Job(CFG, stores, on_event=on_event).run()
    assert all(isinstance(job.error[u], StopRequested) for u in UIDS), job.error
    assert {max(job.commits(u)) for u in UIDS} == {6}


@pytest.mark.timeout(60)
def test_member_at_a_different_step_is_refused_in_band(stores):
    # group 2 starts one step ahead (as a member resumed from a different checkpoint would):
    # the first reduced buffer's step sum is 0+0+1+0, and every member raises before applying
    def prepare(u: int, r: StackedRunner) -> None:
        if u == 2:
            r.step = 1

    job = Job(CFG, stores, prepare=prepare).run()
    assert set(job.error) == set(UIDS)
    for u in UIDS:
        assert isinstance(job.error[u], DivergenceError), job.error[u]
        assert "different steps" in str(job.error[u])
        assert job.events(u, "commit") == []
    # nothing was applied: every member still holds the initial parameters
    init = job.runners[0].trainer.flat_params()
    assert all(torch.equal(job.runners[u].trainer.flat_params(), init) for u in UIDS)


@pytest.mark.timeout(60)
def test_type_counted_twice_is_refused_in_band(stores):
    # group 1's plan also claims type 0 (a plan that diverged): coverage reads [2, 1, 1, 1]
    def prepare(u: int, r: StackedRunner) -> None:
        if u == 1:
            r.contrib = {**r.contrib, 1: (0, 1)}

    job = Job(CFG, stores, prepare=prepare).run()
    assert set(job.error) == set(UIDS)
    for u in UIDS:
        assert isinstance(job.error[u], DivergenceError), job.error[u]
        assert "coverage [2.0, 1.0, 1.0, 1.0]" in str(job.error[u])
        assert job.events(u, "commit") == []


@pytest.mark.timeout(60)
def test_member_that_missed_a_commit_is_rolled_forward(reference, stores):
    # group 3's step-4 all-reduce completes everywhere but reports failure to group 3 only:
    # its peers commit step 4 and fail at step 5 (group 3 broke the generation); after the
    # re-form group 3 is at step 4, the others at 5, and a peer's reduced buffer rolls it
    # forward, with no re-plan of work (nobody died)
    lag, at = 3, 4
    job = Job(CFG, stores, hooks={lag: {"drop_at_call": at}}).run()
    assert job.error == {}
    for u in UIDS:
        assert max_diff(job.result[u], reference) < 1e-12, u
        commits = job.commits(u)
        assert sorted(commits) == list(range(CFG.steps))
        assert commits[at]["rolled"] is (u == lag)
        assert commits[at + 1]["gen"] == 1 and commits[at + 1]["members"] == UIDS
        (rp,) = job.events(u, "replan")
        assert rp["step"] == at + 1 and rp["patch"] == {} and rp["depth"] == 1
    (rf,) = job.events(lag, "roll_forward")
    assert rf["step"] == at and rf["from"] == 0
    assert all(job.events(u, "roll_forward") == [] for u in UIDS if u != lag)
    job.ledger_ok()


@pytest.mark.timeout(60)
def test_member_rolled_forward_past_a_death_journals_the_contributors_of_its_step(
        reference, stores):
    # group 1's step-4 contribution completes the round and then it dies; group 3 is told
    # that same all-reduce failed. Groups 0 and 2 commit step 4 with type 1 from group 1;
    # group 3 is rolled forward in generation 1, where group 1 is no longer a member: its
    # commit of step 4 must still name group 1 (the generation the op ran in), or the ledger
    # sees two different plans for one step
    hooks = {1: {"die_at_call": 4, "die_after_send": True}, 3: {"drop_at_call": 4}}
    job = Job(CFG, stores, hooks=hooks).run()
    assert set(job.error) == {1}
    (rf,) = job.events(3, "roll_forward")
    assert rf["step"] == 4
    for u in (0, 2, 3):
        assert max_diff(job.result[u], reference) < 1e-9, u
        assert job.commits(u)[4]["plan"] == {"0": 0, "1": 1, "2": 2, "3": 3}
    assert job.commits(3)[4]["rolled"] is True and job.commits(3)[4]["gen"] == 1
    job.ledger_ok()


@pytest.mark.timeout(60)
def test_a_settle_that_broke_half_way_ends_in_one_fresh_plan(reference, stores):
    # group 1 dies before sending step 4. In generation 1's settle (each survivor's call 5)
    # group 3 is told the op failed while groups 0 and 2 completed it and re-planned (group 0
    # patch-computes type 1). Generation 2's settle finds the members' plans from different
    # generations and every one takes the same fresh plan for the live slots. The settle's
    # all-reduce is the communicator's without offer/reports (FTComm's settle has none)
    hooks = {1: {"die_at_call": 4}, 3: {"drop_at_call": 5}}
    job = Job(CFG, stores, hooks=hooks, offers=False).run()
    assert set(job.error) == {1}
    for u in (0, 2, 3):
        assert max_diff(job.result[u], reference) < 1e-9, u
        fresh = [e for e in job.events(u, "replan") if e["fresh"]]
        assert [(e["step"], e["members"]) for e in fresh] == [(4, [0, 2, 3])], u
        assert job.commits(u)[4]["plan"] == {"0": 0, "1": 0, "2": 2, "3": 3}
        assert job.commits(u)[4]["gen"] == 2
    assert [e["fresh"] for e in job.events(0, "replan")] == [False, True]
    assert [e["fresh"] for e in job.events(3, "replan")] == [True]
    job.ledger_ok()


class _RaisesOnce(TrainerProxy):
    """The training code fails once: at ``step`` for any of ``types`` (all: None)."""

    def __init__(self, inner, step: int, types: set[int] | None = None) -> None:
        super().__init__(inner)
        self.step, self.types, self.fired = step, types, False

    def grad(self, step, shard_type, out=None):
        if step == self.step and not self.fired and (self.types is None
                                                     or shard_type in self.types):
            self.fired = True
            raise RuntimeError(f"user code bug at step {step}, type {shard_type}")
        return grad_into(self.inner, step, shard_type, out)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["own", "patch"])
def test_training_code_failing_in_the_step_a_group_dies_in_is_one_incident_then_a_retry(
        reference, stores, where):
    # group 1 dies at step 4's all-reduce. "own": every member's code raised computing its
    # own step-4 gradient, so the survivors re-plan with nothing computed (a soak run failed
    # here: "plan assigns types {2} that were never computed"). "patch": the code raises
    # only in group 0's patch of type 1. Either way the error goes in-band with the next op,
    # every survivor meets the same code incident, and the guard's retry recomputes step 4
    # under the new plan: nothing lost, nothing counted twice
    victim, at, survivors = 1, 4, [0, 2, 3]
    raising = survivors if where == "own" else [0]
    types = None if where == "own" else {1}

    def prepare(u: int, r: StackedRunner) -> None:
        if u in raising:
            r.trainer = _RaisesOnce(r.trainer, at, types)

    job = Job(CFG, stores, hooks={victim: {"die_at_call": at}}, prepare=prepare,
              runner=lambda *a, **kw: StackedRunner(*a, verdicts=True, **kw))
    job.group.store.set(f"verdict/{at}/0", json.dumps({"action": "retry"}))  # the guard's
    job.run()
    assert set(job.error) == {victim} and isinstance(job.error[victim], MemberDied)
    for u in survivors:
        assert max_diff(job.result[u], reference) < 1e-9, u
        assert [(e["kind"], e["step"], e["errors"]) for e in job.events(u, "incident")] \
            == [("code", at, len(raising))], u
        assert [e["step"] for e in job.events(u, "step_error")] == ([at] if u in raising
                                                                    else [])
        assert [(e["step"], e["patch"]) for e in job.events(u, "replan")] == [(at, {"0": [1]})]
        assert job.commits(u)[at]["plan"] == {"0": 0, "1": 0, "2": 2, "3": 3}
    assert json.loads(job.group.store.get(f"incident/{at}/0"))["kind"] == "code"
    job.ledger_ok()


# ---------------------------------------------------------------- injected faults (testing/)
def _no_store(kind: str) -> None:
    raise AssertionError(f"a process fault ({kind}) in an in-process test")


def _flags(**kw) -> FaultSpec:
    """A process's faults, all off unless given."""
    return FaultSpec(**{"slow_s": 0.0, **kw})


class _Fixed:
    """A TrainerLike whose gradient is the same small vector at every step."""

    numel = 3
    last_loss: dict[int, float] = {}

    def grad(self, step: int, shard_type: int) -> torch.Tensor:
        return torch.tensor([1.0, -5.0, 2.0], dtype=torch.float64)


def test_faulty_trainer_nan_lands_on_the_largest_element_at_its_step_only():
    told: list[tuple[str, int]] = []
    tr = FaultyTrainer(_Fixed(), GradFaults(nan_at=2),
                       lambda kind, step, at: told.append((kind, step)))
    assert tr.numel == 3
    assert torch.equal(tr.grad(1, 0), _Fixed().grad(1, 0))
    g = tr.grad(2, 0)
    assert g[1].isnan() and torch.equal(g[[0, 2]], torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert not tr.grad(2, 1).isnan().any()  # once: the first gradient of the step
    assert not tr.grad(3, 0).isnan().any()
    assert told == [("nan", 2)]


def test_faulty_trainer_flips_one_bit_from_its_step_on_and_tells_once():
    told: list[tuple[str, int]] = []
    tr = FaultyTrainer(_Fixed(), GradFaults(flip_from=2, slow_from=3, slow_s=0.0),
                       lambda kind, step, at: told.append((kind, step)))
    assert torch.equal(tr.grad(1, 0), _Fixed().grad(1, 0))
    for step in (2, 2, 3, 7):
        g = tr.grad(step, 0)
        assert g[1] != -5.0 and abs(g[1].item() + 5.0) < 0.05  # finite, moved a little
        assert (g[[0, 2]] == torch.tensor([1.0, 2.0], dtype=torch.float64)).all()
    assert told == [("flip", 2), ("slow", 3)]


def test_a_paced_trainer_takes_at_least_its_pace_a_gradient_and_tells_nothing():
    import time

    told: list[tuple[str, int]] = []
    hooks = build(_flags(pace_s=0.03), on_fault=lambda kind: None).hooks
    tr = hooks.wrap_trainer(None, _Fixed())
    tr.tell = lambda kind, step, at: told.append((kind, step))
    for step in range(3):
        t0 = time.perf_counter()
        g = tr.grad(step, 0)
        assert time.perf_counter() - t0 >= 0.03
        assert torch.equal(g, _Fixed().grad(step, 0))  # the same gradient, only later
    assert told == []  # not a fault: nothing reaches the journal or the guard


def test_a_late_holder_fires_its_slots_faults_at_its_first_step_and_names_the_schedule():
    # a slot's replacement that joined at step 7 after its faults' steps (5, 6; NaNs at 6, 9)
    told: list[tuple[str, int, int]] = []
    hooks = SelfFaults()
    assert hooks.load([("nan", 6), ("flip", 5), ("nan", 9)]) is True
    tr = hooks.wrap_trainer(None, _Fixed())
    tr.tell = lambda kind, step, at: told.append((kind, step, at))
    assert hooks.wrap_trainer(None, tr) is tr  # never wrapped twice
    assert tr.grad(7, 0).isnan().any() and not tr.grad(8, 0).isnan().any()
    assert tr.grad(9, 0).isnan().any()
    assert told == [("nan", 7, 6), ("flip", 7, 5), ("nan", 9, 9)]
    assert SelfFaults().load([("kill", 12)]) is False  # a process fault: no trainer to wrap


def test_no_fault_flags_leave_the_real_components_unwrapped():
    f = build(_flags(), on_fault=lambda kind: None)
    comm, tr = object(), _Fixed()
    assert f.comm(comm) is comm and f.hooks.wrap_trainer(None, tr) is tr


@pytest.mark.timeout(60)
def test_dropped_commit_is_rolled_forward(reference, stores):
    # the comm wrapper treats group 2's completed step-4 all-reduce as failed, once: its peers
    # committed step 4, the re-form's settle rolls it forward
    lag, at = 2, 4
    job = Job(CFG, stores, faults={lag: build(_flags(drop_commit_at=at), _no_store)}).run()
    assert job.error == {}
    for u in UIDS:
        assert max_diff(job.result[u], reference) < 1e-12, u
        assert job.commits(u)[at]["rolled"] is (u == lag)
        assert sorted(job.commits(u)) == list(range(CFG.steps))
    (rf,) = job.events(lag, "roll_forward")
    assert rf["step"] == at
    assert [e["reason"] for e in job.comms[lag].journal if "reason" in e] == [
        "injected: completed all-reduce treated as failed"]
    job.ledger_ok()


@pytest.mark.timeout(60)
def test_injected_nan_is_journaled_with_the_group_and_becomes_an_incident(stores):
    job = Job(CFG, stores, faults={2: build(_flags(nan_at=3), _no_store)}).run()
    assert job.error == {}
    (ev,) = job.events(2, "fault")
    assert (ev["kind"], ev["group"], ev["uid"], ev["step"]) == ("nan", 2, 2, 3)
    assert list(ev) == ["event", "kind", "group", "uid", "step", "at", "t"]
    assert [e["step"] for e in job.events(0, "incident") if e["kind"] == "implicit"][:1] == [3]


class _Recorder(StepHooks):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def step_ready(self, runner) -> None:
        self.calls.append(("ready", runner.step))

    def before_allreduce(self, runner) -> None:
        self.calls.append(("op", runner.step))

    def before_patch(self, runner) -> None:
        self.calls.append(("patch", runner.step))

    def after_replan(self, runner, plan) -> None:
        self.calls.append(("replan", runner.step, dict(plan.patch)))


@pytest.mark.timeout(60)
def test_step_hooks_fire_at_their_points(reference, stores):
    # group 1 dies before sending step 4: each survivor's hooks see every step ready once, the
    # step op issued twice at step 4 (the failed one, the retry), and one failure re-plan in
    # which group 0 (type 1's other host) patch-computes type 1
    rec = {u: _Recorder() for u in (0, 2)}
    job = Job(CFG, stores, hooks={1: {"die_at_call": 4}},
              faults={u: Faults(lambda c: c, r) for u, r in rec.items()}).run()
    assert set(job.error) == {1}
    for u, r in rec.items():
        assert [c for c in r.calls if c[0] == "ready"] == [("ready", k) for k in range(CFG.steps)]
        assert [c[1] for c in r.calls if c[0] == "op"].count(4) == 2
        assert [c for c in r.calls if c[0] == "replan"] == [("replan", 4, {0: (1,)})]
        assert [c for c in r.calls if c[0] == "patch"] == ([("patch", 4)] if u == 0 else [])
        assert max_diff(job.result[u], reference) < 1e-9


def test_the_communicators_keep_the_runners_contract(stores):
    # the fake, a fault wrapper around it and the real class all offer what the runner uses
    from unbroken.runtime.comm import CommLike
    from unbroken.runtime.ftcomm import FTComm
    from unbroken.testing.faults import DropCommit

    fake = FakeGroup([0, 1], stores=stores).comm(0)
    assert isinstance(fake, CommLike) and isinstance(DropCommit(fake, at=3), CommLike)
    assert not isinstance(object(), CommLike)
    for name in ("allreduce", "reform", "join", "fail", "generation", "members", "rank"):
        assert hasattr(FTComm, name), name


def test_journals_that_disagree_give_a_no_and_one_line_not_a_traceback():
    def commit(g: int, plan: dict, gen: int = 0) -> dict:
        return {"event": "commit", "step": 0, "gen": gen, "members": [0, 1], "t": float(g),
                "mine": [int(t) for t, w in plan.items() if w == g], "plan": plan}
    agree = {0: [commit(0, {"0": 0, "1": 1})], 1: [commit(1, {"0": 0, "1": 1})]}
    rep, err = check_ledger(agree, 1, 2)
    assert rep.ok and err is None
    split = {0: [commit(0, {"0": 0, "1": 0})], 1: [commit(1, {"0": 1, "1": 1})]}
    rep, err = check_ledger(split, 1, 2)
    assert not rep.ok and err == ("the journals disagree on what was committed: step 0: groups "
                                  "committed different plans")


def test_a_tests_cluster_faults_are_read_from_json_and_bad_ones_named_in_one_line():
    from unbroken.testing.faults import cluster_faults

    got = cluster_faults('{"drop_commit_at": {"2": 400}, "drop_commit_hold_s": 25, '
                         '"pace_s": 0.02}', "F")
    assert got == {"drop_commit_at": {2: 400}, "drop_commit_hold_s": 25.0, "pace_s": 0.02}
    for text, named in (("{", "not JSON"), ("[1]", "a JSON object"),
                        ('{"explode_at": {}}', "'explode_at'"),
                        ('{"die_at": {"x": 3}}', "die_at={'x': 3}"),
                        ('{"drop_commit_hold_s": "soon"}', "a number"),
                        ('{"pace_s": {"0": 1}}', "a number")):
        with pytest.raises(ValueError) as err:
            cluster_faults(text, "F")
        assert str(err.value).startswith("F") and named in str(err.value)
        assert "\n" not in str(err.value)
