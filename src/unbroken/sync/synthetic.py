"""Synthetic per-group step traces with resource signals, for training data and tests.

Each group's step time follows its CPU availability: a straggler on identical GPUs is a group
whose host CPU (data loading, the Python loop, the NIC's interrupts) is contended (STAR's
finding). The load is one of ``sync.trace``'s profiles -- ``bursty`` (AR(1) load with
bursts on random groups), ``persistent`` (one group 1.5-3x slower throughout) or ``rotating``
(each step a random group 2x slower with some probability) -- and

* ``cpu_avail`` = 1 / slowdown (the share of the host's CPU the step got), plus 1 % noise;
* ``step_s`` = base x slowdown x (1 + 3 % noise) (measurement noise the resources do not have);
* ``tx_bytes`` = the gradient bytes of one all-reduce (fixed) x (1 + 1 % noise);
* ``rx_bytes`` = the same plus co-located traffic that grows with the load.

Seeded: the same (kind, seed) gives the same trace.
"""

from __future__ import annotations

import numpy as np

from unbroken.sync.trace import slowdowns

__all__ = ["KINDS", "synthetic_run", "synthetic_runs"]

KINDS = ("bursty", "persistent", "rotating")
GRAD_BYTES = 4.0e6


def synthetic_run(kind: str, groups: int = 8, steps: int = 400, seed: int = 0,
                  base_s: float = 0.1) -> dict[int, list[dict]]:
    """group -> step records (the reader's format: ``journal.KEYS``) of one synthetic run."""
    rng = np.random.default_rng([seed, KINDS.index(kind)])
    if kind == "bursty":
        slow = slowdowns(f"bursty:{seed}", groups, steps)
    elif kind == "persistent":
        g = int(rng.integers(groups))
        slow = slowdowns(f"persistent:{g}@{rng.uniform(1.5, 3.0):.3f}", groups, steps)
        slow = slow * (1 + np.abs(rng.normal(0, 0.03, slow.shape)))
    elif kind == "rotating":
        slow = slowdowns(f"rotating:{rng.uniform(0.1, 0.5):.3f}", groups, steps, seed=seed)
    else:
        raise ValueError(f"unknown synthetic kind {kind!r} (expected one of {KINDS})")
    cpu = np.clip(1.0 / slow * (1 + rng.normal(0, 0.01, slow.shape)), 0.01, 1.0)
    step_s = base_s * slow * (1 + rng.normal(0, 0.03, slow.shape))
    tx = GRAD_BYTES * (1 + rng.normal(0, 0.01, slow.shape))
    rx = tx + GRAD_BYTES * 0.5 * (slow - 1.0)
    return {g: [{"step": s, "step_s": float(step_s[s, g]), "cpu_avail": float(cpu[s, g]),
                 "tx_bytes": float(tx[s, g]), "rx_bytes": float(rx[s, g])}
                for s in range(steps)] for g in range(groups)}


def synthetic_runs(n: int, seed: int = 0, groups: int = 8, steps: int = 400,
                   kinds: tuple[str, ...] = KINDS) -> list[dict[int, list[dict]]]:
    """``n`` runs cycling through ``kinds``, run i seeded ``seed * 1000 + i``."""
    return [synthetic_run(kinds[i % len(kinds)], groups, steps, seed * 1000 + i)
            for i in range(n)]
