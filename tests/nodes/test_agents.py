"""Node agents on this machine (``--local-nodes``): each agent a process tree of its own, real
SIGKILL / SIGSTOP. A node killed mid-run (its agent with every process it started) and a node
cut off (its agent stopped, its workers running on) are both masked: no wipe-out, every step
exactly once, the parameters of the failure-free run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from unbroken.events import Event  # noqa: E402
from unbroken.protocol import ExitCode  # noqa: E402
from unbroken.runtime.trainer import reference_run  # noqa: E402
from unbroken.supervise import JobSpec, Supervisor  # noqa: E402
from unbroken.supervise.spec import FTConfig, check, train_config  # noqa: E402

pytestmark = pytest.mark.mp

STEPS = 12
CUT_STEPS = 120  # ~35 ms a step: the run outlasts the 1 s silence that finds the cut (and
#                  a watcher starved under load, which judges nobody meanwhile)


def _run(tmp_path, faults: str, steps: int = STEPS) -> tuple[JobSpec, object]:
    spec = JobSpec(trainer="mlp", groups=6, steps=steps, faults=faults, local_nodes=3,
                   out=str(tmp_path / "run"), timeout=240, ft=FTConfig(node_staleness=1.0))
    return spec, Supervisor(spec).run()


def _param_diff(spec: JobSpec, params: dict) -> float:
    ref = reference_run(train_config(spec, spec.sdc_interval(check(spec))))
    return max((torch.tensor(p, dtype=torch.float64) - ref).abs().max().item()
               for p in params.values())


def _check_masked(spec, sup_res, events) -> None:
    rep = sup_res.report
    assert sup_res.ok, sup_res.message
    assert rep["steps"] == spec.steps and rep["exactly_once"] is True, rep["ledger"]
    assert not [e for e in events if e["event"] in (Event.WIPEOUT, Event.RESTART,
                                                    Event.RESTART_REQUESTED)]
    assert _param_diff(spec, sup_res.params) < 1e-5


@pytest.mark.timeout(240)
def test_a_node_killed_mid_run_is_masked_exactly_once(tmp_path):
    spec, res = _run(tmp_path, "node:1@4")
    events = _journal(tmp_path)
    faults = [e for e in events if e["event"] == Event.FAULT and e["kind"] == "node"]
    lost = [e for e in events if e["event"] == Event.NODE_LOST]
    assert sorted(e["uid"] for e in faults) == [1, 4]  # node 1 of 3 holds groups 1 and 4
    assert len(lost) == 1 and lost[0]["node"] == 1 and "agent exited" in lost[0]["reason"]
    assert {1, 4} <= set(lost[0]["uids"])
    detected = {e["group"] for e in events if e["event"] == Event.DETECTED}
    assert {1, 4} <= detected
    print(f"node loss noticed {lost[0]['t'] - faults[0]['t']:.3f}s after the kill")
    _check_masked(spec, res, events)
    assert lost[0]["t"] - faults[0]["t"] < 2.0
    _trained_until(events, (1, 4), res.report)  # killed with their agent


def _trained_until(events: list[dict], uids, report: dict) -> None:
    """The members of the lost node committed nothing from the step the survivors re-formed
    without them on, by a replan or by admitting a spare (the drill fires once the supervisor
    has read step S from a journal, so they may have committed a step or two past S by
    then). The one exception is an orphan:
    a member that saw the op of that step complete just before it died while the others saw
    it fail; the ledger must have named it as superseded."""
    # the first generation without them: a replan's, or an admission's when a spare joined
    # in the same re-formation (a loaded CI run evicted a starved group for a stale
    # heartbeat, and its spare's admission at step 7 re-formed without the lost node too)
    last = min(e["step"] for e in events if e["event"] in (Event.REPLAN, Event.ADMIT)
               and not set(uids) & set(e["members"])) - 1
    orphans = {(o["step"], o["group"]) for o in report.get("orphan_commits", [])}
    for uid in uids:
        commits = [e["step"] for e in events
                   if e["event"] == Event.COMMIT and e.get("src") == f"group-{uid}"]
        late = [k for k in commits if k > last]
        assert all((k, uid) in orphans for k in late), (uid, late, sorted(orphans))
        assert len(late) <= 1, (uid, late)


@pytest.mark.timeout(240)
def test_a_node_cut_off_is_detected_by_its_silence_and_masked(tmp_path):
    """The agent is SIGSTOPped; its workers keep running and beating. Only the agent's
    heartbeat tells: the node is fenced (its workers leave, exit 10) and its members declared
    dead (the survivors re-form without them), no wipe-out, exactly once."""
    spec, res = _run(tmp_path, "cut:1@4", steps=CUT_STEPS)
    events = _journal(tmp_path)
    faults = [e for e in events if e["event"] == Event.FAULT and e["kind"] == "cut"]
    lost = [e for e in events if e["event"] == Event.NODE_LOST]
    assert sorted(e["uid"] for e in faults) == [1, 4]
    assert len(lost) == 1 and lost[0]["node"] == 1 and "heartbeat" in lost[0]["reason"]
    print(f"cut-off node noticed {lost[0]['t'] - faults[0]['t']:.3f}s after the stop")
    _check_masked(spec, res, events)
    _trained_until(events, (1, 4), res.report)  # they left when their node was fenced


def _journal(tmp_path) -> list[dict]:
    from helpers import read_journal

    return read_journal(tmp_path / "run" / "journal.jsonl")


@pytest.mark.timeout(240)
def test_every_node_lost_climbs_the_ladder_and_ends_instead_of_respawning_forever(tmp_path):
    """Both nodes killed: the replacements have no live node to start on and die as they are
    placed. Without progress between those deaths they are one incident, so the ladder climbs
    retry -> restart and the job ends with one line saying why, its processes gone (before:
    each replacement opened a fresh incident and was respawned again, thousands a minute,
    until the descriptors ran out)."""
    import os

    spec = JobSpec(trainer="mlp", groups=4, steps=400, faults="node:0@4,node:1@8",
                   local_nodes=2, out=str(tmp_path / "run"), timeout=200,
                   ft=FTConfig(node_staleness=1.0))
    res = Supervisor(spec).run()
    events = _journal(tmp_path)
    assert res.code == ExitCode.NO_PROGRESS and "every node was lost" in res.message, res
    assigns = [e for e in events if e["event"] == Event.ASSIGN]
    rungs = [e["rung"] for e in events if e["event"] == Event.LADDER]
    assert len(assigns) <= 6, len(assigns)  # two masked deaths, two retries, no loop
    assert "restart" in rungs, rungs
    assert len({e["node"] for e in events if e["event"] == Event.NODE_LOST}) == 2
    me = os.getpid()
    with open(f"/proc/{me}/task/{me}/children") as f:
        left = [open(f"/proc/{p}/cmdline").read() for p in f.read().split()]
    # no agent, worker or store behind (this process's fork server lives as long as it does)
    assert not [c for c in left if "spawn import _serve" not in c], left
