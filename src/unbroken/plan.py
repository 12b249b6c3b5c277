"""``unbroken plan``: theory and simulation side by side, and a recommendation.

For each strategy (SPARe + checkpointing, replication + checkpointing) the planner sweeps the
redundancy, evaluates the closed forms at every point (milliseconds), simulates every point
over several seeds with the same policy code the runtime uses (seconds), and recommends the
configuration with the lowest simulated time-to-train. Checkpoint/restart alone is reported
from theory and from a capped simulation: at a 5-minute MTBF and a 60-minute restart it does
not finish.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from unbroken.core import placement, theory
from unbroken.core.recommend import Candidate, best_in_theory, best_simulated, recommend
from unbroken.core.scenario import Scenario
from unbroken.sim.engine import RunResult
from unbroken.sim.sweep import Job, run_jobs, summarize

STRATEGY_NAMES = {"spare": "SPARe+CKPT", "rep": "Rep+CKPT", "ckpt": "CKPT only"}


@dataclass(frozen=True)
class PlanRequest:
    scenario: Scenario
    seeds: int = 5
    seed: int = 0
    r_max: int = 20
    workers: int | None = None


def redundancies(req: PlanRequest, strategy: str) -> list[int]:
    n = req.scenario.groups
    top = placement.max_redundancy(n) if strategy == "spare" else n
    return list(range(2, min(req.r_max, top) + 1))


def check(req: PlanRequest) -> None:
    """Raise ValueError when there is nothing to sweep for some strategy."""
    for strategy in ("spare", "rep"):
        if not redundancies(req, strategy):
            raise ValueError(
                f"groups {req.scenario.groups} too small to plan {STRATEGY_NAMES[strategy]}: "
                f"redundancy 2 needs at least {placement.min_groups(2)} groups")


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
    out["r_star_closed_form"] = theory.r_star_closed_form(sc.groups)
    out["seeds"] = req.seeds
    out["wall_s"] = time.perf_counter() - t_start
    return out


def _scenario_dict(sc: Scenario) -> dict:
    d = asdict(sc)
    d["t_allreduce"] = sc.allreduce
    d["gpus_per_group"] = sc.gpus / sc.groups
    return d
