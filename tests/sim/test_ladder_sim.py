"""The recovery ladder as a simulator strategy: determinism, trends, accounting, bad input."""

import json

import numpy as np
import pytest

from unbroken.core.ladder import FaultKind, LadderPolicy, Rung
from unbroken.core.scenario import Scenario
from unbroken.sim.ladder import (DEFAULT_MIX, LadderConfig, simulate_ladder, summarize_ladder,
                                 without_cheap_rungs)

SMALL = Scenario(groups=60, gpus=6000, steps=300, mtbf=3000.0)  # ~6 faults/run, ms per run
SEEDS = range(6)


def _ettr(sc, **kw):
    return float(np.mean([simulate_ladder(sc, seed=s, **kw).ettr for s in SEEDS]))


def test_same_seed_same_result_other_seed_differs():
    a = simulate_ladder(SMALL, redundancy=3, seed=5)
    b = simulate_ladder(SMALL, redundancy=3, seed=5)
    c = simulate_ladder(SMALL, redundancy=3, seed=6)
    assert a == b
    assert a.seed == 5 and a.faults > 0
    assert (a.wall_s, a.rung_counts) != (c.wall_s, c.rung_counts)


def test_every_second_is_booked_once():
    for s in SEEDS:
        r = simulate_ladder(SMALL, redundancy=3, seed=s)
        booked = r.productive_s + r.checkpoint_s + sum(r.lost_by_rung.values())
        assert booked == pytest.approx(r.wall_s, rel=1e-9)
        assert sum(r.lost_by_kind.values()) == pytest.approx(sum(r.lost_by_rung.values()),
                                                             rel=1e-9)
        assert r.ettr == pytest.approx(r.productive_s / r.wall_s)
        # productive: each committed step once, at its failure-free length; faults cost
        assert r.productive_s == pytest.approx(r.steps_done * SMALL.t0 / SMALL.steps)
        assert r.faults > 0 and r.ettr < 1
        assert set(r.rung_counts) <= {x.name.lower() for x in Rung}


def test_ettr_falls_as_mtbf_falls():
    ettrs = [_ettr(SMALL.with_(mtbf=m), redundancy=3) for m in (30000.0, 6000.0, 1500.0)]
    assert ettrs[0] > ettrs[1] > ettrs[2]


def test_cheap_rungs_are_worth_their_place():
    cheap = _ettr(SMALL, redundancy=3)
    without = _ettr(SMALL, redundancy=3, policy=without_cheap_rungs())
    assert without < cheap
    r = simulate_ladder(SMALL, redundancy=3, seed=0, policy=without_cheap_rungs())
    assert not {"mask", "evict", "retry"} & set(r.rung_counts)


def test_masking_needs_redundancy():
    with_r = [simulate_ladder(SMALL, redundancy=3, seed=s) for s in SEEDS]
    plain = [simulate_ladder(SMALL, redundancy=1, seed=s) for s in SEEDS]
    assert sum(r.rung_counts.get("mask", 0) for r in with_r) > 0
    assert all("mask" not in r.rung_counts for r in plain)


def test_pure_code_faults_are_resolved_by_rollback():
    cfg = LadderConfig(mix={"code": 1.0})
    sc = SMALL.with_(mtbf=15000.0, fail_dist="exponential")
    policy = LadderPolicy(resolved_after=1)  # faults far apart: one incident each
    results = [simulate_ladder(sc, seed=s, config=cfg, policy=policy) for s in SEEDS]
    assert sum(r.faults for r in results) > 0
    for r in results:
        assert r.completed and not r.gave_up
        assert r.rung_counts == ({"rollback": r.faults} if r.faults else {})
        assert set(r.lost_by_kind) <= {"code"}


def test_code_fault_without_rollback_gives_up():
    policy = LadderPolicy(time_budget=1e-3, max_attempts={Rung.ROLLBACK: 0, Rung.REQUEUE: 0})
    r = simulate_ladder(SMALL, seed=0, config=LadderConfig(mix={"code": 1.0}), policy=policy)
    assert r.gave_up and not r.completed
    assert "exit 6" in r.gave_up_reason
    assert r.steps_done < SMALL.steps


def test_summary_averages_the_seeds():
    results = [simulate_ladder(SMALL, redundancy=3, seed=s) for s in SEEDS]
    s = summarize_ladder(results)
    assert s["ettr"] == pytest.approx(np.mean([r.ettr for r in results]))
    assert [p["seed"] for p in s["per_seed"]] == list(SEEDS)
    assert s["completed"] + s["gave_up"] <= len(results)


def test_default_mix_is_a_distribution():
    assert sum(DEFAULT_MIX.values()) == pytest.approx(1.0)
    assert FaultKind.WIPE_OUT not in DEFAULT_MIX


@pytest.mark.parametrize("kwargs, named", [
    ({"evict_s": -1.0}, "evict_s=-1.0"),
    ({"retry_s": float("nan")}, "retry_s=nan"),
    ({"mix": {"death": 0.5, "hang": 0.4}}, "sum to 0.9"),
    ({"mix": {"bogus": 1.0}}, "'bogus'"),
    ({"mix": {"wipe-out": 1.0}}, "mix[wipe-out]"),
    ({"detect": {"gremlin": 1.0}}, "'gremlin'"),
    ({"detect": {"hang": -5}}, "detect[hang]=-5"),
    ({"transient": 1.5}, "transient=1.5"),
    ({"xid_actions": {"reset_gpu": 2.0}}, "xid_actions[reset_gpu]=2.0"),
    ({"implicit_causes": {"cosmic": 1.0}}, "'cosmic'"),
])
def test_bad_config_names_the_value(kwargs, named):
    with pytest.raises(ValueError) as e:
        LadderConfig(**kwargs)
    assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs, named", [
    ({"redundancy": 0}, "redundancy=0"),
    ({"redundancy": 40}, "redundancy 40"),
    ({"standby_count": -1}, "standby_count=-1"),
    ({"ckpt_every": 0}, "ckpt_every=0"),
])
def test_bad_run_arguments_name_the_value(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("=", "=")):
        simulate_ladder(SMALL, **kwargs)


@pytest.mark.mp
def test_cli_plan_with_ladder_reports_it(cli, tmp_path):
    p = cli("plan", "--groups", "60", "--gpus", "6000", "--steps", "200", "--seeds", "2",
            "--r-max", "3", "--mtbf", "50m", "--jobs", "1", "--png", str(tmp_path / "p.png"),
            "--ladder", "--json", timeout=60)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    lad = plan["ladder"]
    assert lad["redundancy"] == plan["spare"]["best"]["redundancy"]
    assert [s["seed"] for s in lad["per_seed"]] == [0, 1]
    assert lad["ettr"] == pytest.approx(np.mean([s["ettr"] for s in lad["per_seed"]]))
    assert lad["without_cheap_rungs"]["ettr"] < lad["ettr"]
    assert "ladder" not in json.loads(cli(
        "plan", "--groups", "60", "--gpus", "6000", "--steps", "100", "--seeds", "1",
        "--r-max", "2", "--jobs", "1", "--png", str(tmp_path / "q.png"), "--json",
        timeout=60).stdout)


@pytest.mark.mp
def test_cli_simulate_ladder_text_and_bad_redundancy(cli):
    p = cli("simulate", "--strategy", "ladder", "--groups", "60", "--gpus", "6000",
            "--steps", "200", "--mtbf", "50m", "--redundancy", "3", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ETTR" in p.stdout and "Recovery ladder" in p.stdout
    bad = cli("simulate", "--strategy", "ladder", "--groups", "10", "--gpus", "600",
              "--redundancy", "9", timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
