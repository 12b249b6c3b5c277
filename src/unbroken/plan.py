"""``unbroken plan``: theory and simulation side by side, and a recommendation.

For each strategy (SPARe + checkpointing, replication + checkpointing) the planner sweeps the
redundancy, evaluates the closed forms at every point (milliseconds), simulates every point
over several seeds with the same policy code the runtime uses (seconds), and recommends the
configuration with the lowest simulated time-to-train. Checkpoint/restart alone is reported
from theory and from a capped simulation: at a 5-minute MTBF and a 60-minute restart it does
not finish.

With ``ladder=True`` the plan also plays the recovery ladder (``sim.ladder``) on the scenario at
SPARe's best simulated redundancy: its ETTR with the default ``core.ladder`` policy and with the
cheap rungs (mask, evict, retry) switched off, so a user sees what the ladder is worth there.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from unbroken.core import placement, theory
from unbroken.core.recommend import Candidate, best_in_theory, best_simulated, recommend
from unbroken.core.scenario import Scenario
from unbroken.core.ladder import LadderPolicy
from unbroken.sim.engine import RunResult
from unbroken.sim.ladder import simulate_ladder, summarize_ladder, without_cheap_rungs
from unbroken.sim.sweep import Job, run_jobs, summarize

STRATEGY_NAMES = {"spare": "SPARe+CKPT", "rep": "Rep+CKPT", "ckpt": "CKPT only"}


@dataclass(frozen=True)
class PlanRequest:
    scenario: Scenario
    seeds: int = 5
    seed: int = 0
    r_max: int = 20
    workers: int | None = None
    ladder: bool = False


def redundancies(req: PlanRequest, strategy: str) -> list[int]:
    n = req.scenario.groups
    top = placement.max_redundancy(n) if strategy == "spare" else n
    return list(range(2, min(req.r_max, top) + 1))


def caps(req: PlanRequest) -> list[str]:
    """One line per strategy whose sweep stops below ``r_max``, saying where and why (a plan
    never truncates silently)."""
    n = req.scenario.groups
    out = []
    top = placement.max_redundancy(n)
    if req.r_max > top >= 2:
        if top == placement.MAX_REDUNDANCY:
            why = (f"no optimal Golomb ruler of order {top + 1} is known (r <= "
                   f"{placement.MAX_REDUNDANCY})")
        else:
            why = (f"the order-{top + 1} Golomb ruler needs N >= "
                   f"{placement.min_groups(top + 1)}")
        out.append(f"--r-max {req.r_max} capped at r = {top} for {STRATEGY_NAMES['spare']}: "
                   f"N = {n} supports r <= {top} ({why})")
    if req.r_max > n:
        out.append(f"--r-max {req.r_max} capped at r = {n} for {STRATEGY_NAMES['rep']}: a "
                   f"replica set cannot have more members than the {n} groups")
    return out


def check(req: PlanRequest) -> None:
    """Raise ValueError when there is nothing to sweep for some strategy."""
    for strategy in ("spare", "rep"):
        if not redundancies(req, strategy):
            raise ValueError(
                f"groups {req.scenario.groups} too small to plan {STRATEGY_NAMES[strategy]}: "
                f"redundancy 2 needs at least {placement.min_groups(2)} groups")


def nodes_needed_by_r(req: PlanRequest) -> dict[int, int | None]:
    """The fewest nodes that keep a node loss safe, for every SPARe redundancy swept."""
    n = req.scenario.groups
    return {r: placement.nodes_needed(placement.make_layout(n, r))[0]
            for r in redundancies(req, "spare")}


def jobs_for(req: PlanRequest) -> list[Job]:
    seeds = range(req.seed, req.seed + req.seeds)
    jobs = [Job(s, r, sd) for s in ("spare", "rep") for r in redundancies(req, s) for sd in seeds]
    jobs.append(Job("ckpt", 1, req.seed))
    return jobs


def _theory_point(sc: Scenario, strategy: str, r: int) -> theory.StrategyTheory:
    return theory.spare(sc, r, mc_trials=0) if strategy == "spare" else \
        theory.replication(sc, r)


def make_plan(req: PlanRequest,
              on_done: Callable[[RunResult], None] | None = None) -> dict:
    """Run the sweep and return the plan as plain data (what ``--json`` prints)."""
    sc = req.scenario
    check(req)
    t_start = time.perf_counter()
    jobs = jobs_for(req)
    results = run_jobs(sc, jobs, req.workers, on_done)
    by_key: dict[tuple[str, int], list[RunResult]] = {}
    for job, res in zip(jobs, results):
        by_key.setdefault((job.strategy, job.redundancy), []).append(res)

    out: dict = {"scenario": _scenario_dict(sc)}
    candidates: list[Candidate] = []
    for strategy in ("spare", "rep"):
        rows, mine = {}, []
        for r in redundancies(req, strategy):
            th = _theory_point(sc, strategy, r)
            sim = summarize(by_key[(strategy, r)])
            rows[r] = {"redundancy": r, "theory": asdict(th), "sim": sim}
            mine.append(Candidate(strategy, r, sim["ckpt_every"], sim["ttt_over_t0"],
                                  sim["availability"], th.ttt_over_t0))
        candidates += mine
        b, tb = rows[best_simulated(mine).redundancy], rows[best_in_theory(mine).redundancy]
        out[strategy] = {
            "name": STRATEGY_NAMES[strategy],
            "best": {"redundancy": b["redundancy"], "ckpt_every": b["sim"]["ckpt_every"],
                     "ttt_over_t0": b["sim"]["ttt_over_t0"],
                     "availability": b["sim"]["availability"],
                     "theory_ttt_over_t0": b["theory"]["ttt_over_t0"],
                     "theory_availability": b["theory"]["availability"]},
            "theory_best": {"redundancy": tb["redundancy"],
                            "ckpt_every": tb["theory"]["ckpt_every_steps"],
                            "ttt_over_t0": tb["theory"]["ttt_over_t0"],
                            "availability": tb["theory"]["availability"]},
            "sweep": list(rows.values()),
        }
    ck = by_key[("ckpt", 1)][0]
    ck_theory = theory.checkpoint_only(sc).availability
    out["ckpt"] = {"name": STRATEGY_NAMES["ckpt"], "sim_ttt_over_t0": ck.ttt_over_t0,
                   "sim_completed": ck.completed, "sim_availability": ck.availability,
                   "theory_availability": ck_theory}
    choice, reason = recommend(candidates)
    out["recommendation"] = {"strategy": choice.strategy, "redundancy": choice.redundancy,
                             "ckpt_every": choice.ckpt_every, "ttt_over_t0": choice.sim_ttt,
                             "availability": choice.sim_availability, "reason": reason}
    if req.ladder:
        r = out["spare"]["best"]["redundancy"]
        out["ladder"] = ladder_summary(sc, r, req.seeds, req.seed)
        cheap = ladder_summary(sc, r, req.seeds, req.seed, policy=without_cheap_rungs())
        out["ladder"]["without_cheap_rungs"] = {
            k: cheap[k] for k in ("ettr", "ettr_std", "ttt_over_t0", "gave_up", "completed",
                                  "rung_counts")}
    out["r_star_closed_form"] = theory.r_star_closed_form(sc.groups)
    out["notes"] = caps(req)
    out["seeds"] = req.seeds
    out["wall_s"] = time.perf_counter() - t_start
    return out


def _scenario_dict(sc: Scenario) -> dict:
    d = asdict(sc)
    d["t_allreduce"] = sc.allreduce
    d["gpus_per_group"] = sc.gpus / sc.groups
    return d


def ladder_summary(sc: Scenario, redundancy: int, seeds: int = 1, seed: int = 0,
                   policy: LadderPolicy | None = None, ckpt_every: int | None = None) -> dict:
    """The recovery ladder on ``sc`` over ``seeds`` seeds from ``seed`` (``sim.ladder``)."""
    t0 = time.perf_counter()
    results = [simulate_ladder(sc, redundancy=redundancy, seed=s, policy=policy,
                               ckpt_every=ckpt_every) for s in range(seed, seed + seeds)]
    out = {"strategy": "ladder", "groups": sc.groups, "seeds": seeds,
           **summarize_ladder(results)}
    out["wall_s"] = time.perf_counter() - t0
    return out


def ladder_lines(ladder: dict) -> list[str]:
    """The ladder's result as a few lines of text (the terminal view of plan / simulate)."""
    lines = [f"Recovery ladder at r={ladder['redundancy']}, {ladder['standby']} warm standbys, "
             f"checkpoint every {ladder['ckpt_every']} steps: ETTR {ladder['ettr']:.1%} "
             f"(± {ladder['ettr_std']:.1%}, {ladder['seeds']} seeds), TTT/T0 "
             f"{ladder['ttt_over_t0']:.2f}, gave up in {ladder['gave_up']}/{ladder['seeds']}"]
    cheap = ladder.get("without_cheap_rungs")
    if cheap:
        lines.append(f"  without mask/evict/retry: ETTR {cheap['ettr']:.1%}, gave up in "
                     f"{cheap['gave_up']}/{ladder['seeds']}")
    rungs = ", ".join(f"{k} {v:.1f}" for k, v in ladder["rung_counts"].items())
    lost = ", ".join(f"{k} {v / 3600:.2f} h" for k, v in ladder["lost_by_rung"].items())
    lines.append(f"  rungs per run: {rungs or 'none'}")
    lines.append(f"  time lost per run: {lost or 'none'}")
    return lines
