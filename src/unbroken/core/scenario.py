"""The cluster a plan is made for: one immutable record shared by theory and simulator.

Why one record
--------------
The closed forms and the discrete-event simulator must describe the *same* cluster, or their
side-by-side numbers mean nothing. Both read this dataclass; nothing else carries parameters.
Defaults are the SPARe paper's scenario: 600k GPUs in N = 600 data-parallel groups, a system
MTBF of 5 minutes (Weibull shape 0.78), a 60-minute global restart, a 60 s checkpoint save,
64 s of compute per stack, an all-reduce of N/100 s and 10,000 steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

FAILURE_DISTS = ("weibull", "exponential")


class ScenarioError(ValueError):
    """A parameter outside its domain; the message names the value."""


_DAY = 86_400.0
#: What a cluster can physically have: (low, high, unit, why). Outside these ranges the closed
#: forms still return numbers (a 60-digit checkpoint interval, TTT/T0 = 1e301), but they mean
#: nothing, so the scenario refuses them and names the value.
LIMITS: dict[str, tuple[float, float, str, str]] = {
    "groups": (1, 10_000_000, "", "more data-parallel groups than any machine built"),
    "gpus": (1, 1_000_000_000, "", "more GPUs than exist"),
    "steps": (1, 1_000_000_000, "", "a billion optimizer steps at most"),
    "t_compute": (1e-3, _DAY, "s", "compute per stack from 1 ms to 1 day"),
    "t_allreduce": (1e-6, _DAY, "s", "an all-reduce from 1 us to 1 day"),
    "mtbf": (1.0, 1e18, "s", "a system MTBF below 1 s means nothing runs at all; 1e18 s "
             "(longer than the age of the universe) already means no failure at all"),
    "t_restart": (0.0, 30 * _DAY, "s", "a global restart of at most 30 days"),
    "t_save": (0.0, _DAY, "s", "a checkpoint save of at most 1 day"),
    "t_shrink": (0.0, 3600.0, "s", "a communicator shrink of at most 1 hour"),
    "jitter": (0.0, 1.0, "", "the std of the N(1, s^2) compute factor must be below 1"),
    "allreduce_fail_scale": (0.0, 1.0, "", "a share of the all-reduce time"),
    "weibull_shape": (0.1, 20.0, "", "Weibull shapes of real failure logs lie in 0.5-1.5"),
}
_OPEN_ABOVE = {"jitter"}


def _show(v: float, unit: str) -> str:
    return f"{v:g} {unit}" if unit else f"{v:g}"


@dataclass(frozen=True)
class Scenario:
    groups: int = 600                 # N data-parallel groups
    gpus: int = 600_000               # total GPUs (M = gpus / N per group)
    steps: int = 10_000
    t_compute: float = 64.0           # seconds per stack (one shard's forward + backward)
    t_allreduce: float | None = None  # seconds; None means N / 100 as in the paper
    mtbf: float = 300.0               # system MTBF in seconds (every group together)
    t_restart: float = 3600.0         # global restart
    t_save: float = 60.0              # checkpoint save
    t_shrink: float = 0.1             # communicator shrink after a masked failure
    allreduce_fail_scale: float = 0.5 # a failed step's all-reduce costs this share of T_a
    jitter: float = 0.05              # compute time x N(1, jitter^2) per stack
    fail_dist: str = "weibull"
    weibull_shape: float = 0.78
    # The SPARe authors' simulator commits a step whose failure the controller answers in its
    # fixed phase after half an all-reduce, with no retried all-reduce (and skips a checkpoint
    # whose writer failed). That can make failures *speed training up* when T_a is large, so it
    # is off by default; on, the simulator reproduces the authors' accounting (sim/engine.py).
    paper_shortcut: bool = False
    # ranks (processes) in one group, the model sharded over them. A rank's failure is its
    # whole group's: a group's next failure is the first of its R ranks' (each a renewal
    # process of mean ``rank_mtbf``), and ``mtbf`` is the system's with every rank fresh
    ranks_per_group: int = 1

    def __post_init__(self) -> None:
        ints = {"groups": self.groups, "gpus": self.gpus, "steps": self.steps,
                "ranks_per_group": self.ranks_per_group}
        for name, v in ints.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ScenarioError(f"{name} must be a positive integer, got {v!r}")
        for name, (lo, hi, unit, why) in LIMITS.items():
            v = getattr(self, name)
            if v is None:
                continue
            if not _finite(v):
                raise ScenarioError(f"{name} must be a finite number, got {v!r}")
            if not lo <= v <= hi or (name in _OPEN_ABOVE and v >= hi):
                closing = ")" if name in _OPEN_ABOVE else "]"
                raise ScenarioError(
                    f"{name} {_show(v, unit)} outside [{_show(lo, unit)}, {_show(hi, unit)}"
                    f"{closing}: {why}")
        if self.fail_dist not in FAILURE_DISTS:
            raise ScenarioError(f"unknown failure distribution {self.fail_dist!r} "
                                f"(choose from {', '.join(FAILURE_DISTS)})")
        if self.gpus < self.groups:
            raise ScenarioError(f"gpus {self.gpus} is fewer than groups {self.groups}: "
                                "each group needs at least one GPU")
        if self.gpus < self.groups * self.ranks_per_group:
            raise ScenarioError(f"ranks_per_group {self.ranks_per_group} x groups "
                                f"{self.groups} = {self.groups * self.ranks_per_group} ranks, "
                                f"more than gpus {self.gpus}: each rank needs at least one "
                                f"GPU")

    @property
    def allreduce(self) -> float:
        """All-reduce seconds: given, or N / 100 (2, 6, 10 s at N = 200, 600, 1000)."""
        return self.groups / 100.0 if self.t_allreduce is None else self.t_allreduce

    @property
    def rank_mtbf(self) -> float:
        """Mean time between failures of one rank: the system MTBF times N x R."""
        return self.mtbf * self.groups * self.ranks_per_group

    @property
    def rank_weibull_scale(self) -> float:
        """Weibull lambda of one rank's failure intervals."""
        return self.rank_mtbf / math.gamma(1.0 + 1.0 / self.weibull_shape)

    @property
    def group_mtbf(self) -> float:
        """Mean time between failures of one group: the first of its R fresh ranks'. The
        system MTBF times N for one rank a group, or exponential failures; with Weibull
        failures of shape k, x R^(1 - 1/k) (the first of R Weibull draws is Weibull with
        lambda / R^(1/k): fresh ranks with k < 1 fail early, so a group of more ranks fails
        more than R times as often as one)."""
        if self.fail_dist == "exponential" or self.ranks_per_group == 1:
            return self.mtbf * self.groups
        return self.weibull_scale * math.gamma(1.0 + 1.0 / self.weibull_shape)

    @property
    def system_mtbf(self) -> float:
        """Mean time between failures of the whole job, as the closed forms use it: a group's
        over N (``mtbf`` itself for one rank a group)."""
        return self.mtbf if self.ranks_per_group == 1 else self.group_mtbf / self.groups

    @property
    def weibull_scale(self) -> float:
        """Weibull lambda of one group's intervals (the first of its ranks'): 155,937 s at
        N = 600, k = 0.78, R = 1."""
        return self.rank_weibull_scale * self.ranks_per_group ** (-1.0 / self.weibull_shape)

    @property
    def t0(self) -> float:
        """Failure-free, jitter-free time to train: steps x (T_compute + T_a)."""
        return self.steps * (self.t_compute + self.allreduce)

    def with_(self, **changes) -> "Scenario":
        return replace(self, **changes)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
