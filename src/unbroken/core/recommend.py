"""Pick the configuration to run: the decision behind ``unbroken plan``.

Why simulation first
--------------------
The closed forms are fast and explain the trend, but they assume uniform independent
failures and exponential-like behaviour; with Weibull k < 1 the simulated optimum sits about
one redundancy step away (spare.md §5). So the recommendation is the lowest *simulated* mean
time-to-train, and the reason line says how far theory's own choice lies from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    strategy: str
    redundancy: int
    ckpt_every: int
    sim_ttt: float
    sim_availability: float
    theory_ttt: float


def best_simulated(candidates: list[Candidate]) -> Candidate:
    """The lowest simulated mean TTT/T0 (ties: lower redundancy)."""
    return min(candidates, key=lambda c: (c.sim_ttt, c.redundancy))


def best_in_theory(candidates: list[Candidate]) -> Candidate:
    """The exact minimiser of the closed-form TTT/T0 (ties: lower redundancy)."""
    return min(candidates, key=lambda c: (c.theory_ttt, c.redundancy))


def recommend(candidates: list[Candidate]) -> tuple[Candidate, str]:
    """Return (the candidate with the lowest simulated TTT/T0, a one-line reason)."""
    if not candidates:
        raise ValueError("no candidates to recommend from")
    best = min(candidates, key=lambda c: (c.sim_ttt, c.strategy, c.redundancy))
    by_theory = best_in_theory([c for c in candidates if c.strategy == best.strategy])
    others = [c for c in candidates if c.strategy != best.strategy]
    parts = [f"{best.strategy} r={best.redundancy} with a checkpoint every {best.ckpt_every} "
             f"steps: simulated TTT/T0 {best.sim_ttt:.2f} at {best.sim_availability:.1%} "
             f"availability"]
    if others:
        runner = best_simulated(others)
        gain = 1.0 - best.sim_ttt / runner.sim_ttt
        parts.append(f"{gain:.1%} faster than the best {runner.strategy} "
                     f"(r={runner.redundancy}, {runner.sim_ttt:.2f})")
    if by_theory.redundancy != best.redundancy:
        parts.append(f"theory's optimum r={by_theory.redundancy} simulates at "
                     f"{by_theory.sim_ttt:.2f}")
    return best, "; ".join(parts)
