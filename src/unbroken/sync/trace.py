"""Straggler profiles as a per-step slowdown matrix: the synthetic load behind the predictor's
and the selector's training data (``unbroken.sync``). What a user types (``--stragglers`` on
run, demo and plan) is parsed by ``core.stragglers``, the runtime's own trace; this module's
bursty model (bursts of 2.5x ramping in and out) differs from it on purpose (training data wants
smooth onsets to learn from) and keeps the same grammar.

Why a matrix
------------
The sync-mode cost model (``core.sync``) needs, for each step, how much slower each
data-parallel group is than its straggler-free self. Every profile -- a fixed slow group, bursts
of load, a slow group that moves around, a measured CSV -- reduces to one ``(steps, groups)``
array of factors >= 1.0, so the planner evaluates every mode on the same numbers.

The grammar is the one of issue 11's ``--stragglers SPEC``:

* ``persistent:G@F[,G@F...]`` -- group G is F times slower on every step (F >= 1);
* ``bursty:SEED`` -- each group's load is an AR(1) process with bursts on random groups;
* ``rotating:P`` -- on each step, with probability P, one random group is 2x slower;
* a path to a CSV file ``step,group,slowdown`` (a header line is allowed): one row per change,
  the slowdown (>= 1.0) holds for that group from that step until its next row.

Bad input raises ValueError with one line naming the bad value. Not in ``core``: it is the
sync face's training data, not a decision, and :func:`parse_spec` reads a CSV file when given
a path.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["StragglerSpec", "parse_spec", "slowdowns", "straggler_frequency",
           "ROTATING_FACTOR", "STRAGGLER_RATIO"]

#: how much slower the slowed group of a ``rotating`` step is
ROTATING_FACTOR = 2.0
#: a group is a straggler when its step takes more than this times the fastest group's
STRAGGLER_RATIO = 1.2


@dataclass(frozen=True)
class StragglerSpec:
    """A parsed ``--stragglers`` value.

    Attributes:
        kind: ``persistent``, ``bursty``, ``rotating`` or ``csv``.
        text: the spec as given (for messages).
        persistent: (group, factor) pairs of a persistent spec.
        seed: the seed of a bursty spec.
        prob: the per-step probability of a rotating spec.
        rows: (step, group, slowdown) rows of a CSV spec, in file order.
    """

    kind: str
    text: str
    persistent: tuple[tuple[int, float], ...] = ()
    seed: int = 0
    prob: float = 0.0
    rows: tuple[tuple[int, int, float], ...] = ()


def _float(text: str, what: str, spec: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise ValueError(f"--stragglers {spec!r}: {what} {text!r} is not a number")
    return v


def _int(text: str, what: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--stragglers {spec!r}: {what} {text!r} is not an integer") from None


def parse_spec(text: str) -> StragglerSpec:
    """Parse a ``--stragglers`` value (see the module docstring); a CSV path is read here."""
    head, _, rest = text.partition(":")
    if head == "persistent" and rest:
        pairs = []
        for item in rest.split(","):
            g, at, f = item.partition("@")
            if not at:
                raise ValueError(f"--stragglers {text!r}: expected G@F, got {item!r}")
            gi, fv = _int(g, "group", text), _float(f, "slowdown", text)
            if gi < 0:
                raise ValueError(f"--stragglers {text!r}: group {gi} is negative")
            if fv < 1.0:
                raise ValueError(f"--stragglers {text!r}: slowdown {f} is below 1.0")
            pairs.append((gi, fv))
        return StragglerSpec("persistent", text, persistent=tuple(pairs))
    if head == "bursty" and rest:
        return StragglerSpec("bursty", text, seed=_int(rest, "seed", text))
    if head == "rotating" and rest:
        p = _float(rest, "probability", text)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"--stragglers {text!r}: probability {rest} outside [0, 1]")
        return StragglerSpec("rotating", text, prob=p)
    if os.path.isfile(text):
        return StragglerSpec("csv", text, rows=_read_csv(text))
    raise ValueError(f"--stragglers {text!r}: not persistent:G@F, bursty:SEED, rotating:P or "
                     f"an existing CSV file")


def _read_csv(path: str) -> tuple[tuple[int, int, float], ...]:
    rows = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            lines = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--stragglers {path!r}: unreadable ({e})") from None
    for n, row in enumerate(lines, 1):
        if not row or all(not c.strip() for c in row):
            continue
        if n == 1 and [c.strip() for c in row] == ["step", "group", "slowdown"]:
            continue
        if len(row) != 3:
            raise ValueError(f"--stragglers {path!r} line {n}: expected step,group,slowdown, "
                             f"got {','.join(row)!r}")
        try:
            step, group, slow = int(row[0]), int(row[1]), float(row[2])
        except ValueError:
            raise ValueError(f"--stragglers {path!r} line {n}: bad row "
                             f"{','.join(row)!r}") from None
        if step < 0 or group < 0:
            raise ValueError(f"--stragglers {path!r} line {n}: negative step or group in "
                             f"{','.join(row)!r}")
        if not (slow >= 1.0 and math.isfinite(slow)):
            raise ValueError(f"--stragglers {path!r} line {n}: slowdown {row[2].strip()} is "
                             f"below 1.0")
        rows.append((step, group, slow))
    if not rows:
        raise ValueError(f"--stragglers {path!r}: no rows")
    return tuple(rows)


def slowdowns(spec: StragglerSpec | str, groups: int, steps: int, seed: int = 0) -> np.ndarray:
    """The ``(steps, groups)`` slowdown factors (>= 1.0) of ``spec``.

    ``seed`` seeds ``rotating`` (a ``bursty`` spec carries its own seed). A group id outside
    ``[0, groups)`` raises ValueError naming it.
    """
    if isinstance(spec, str):
        spec = parse_spec(spec)
    if groups < 1 or steps < 1:
        raise ValueError(f"need at least one group and one step, got {groups} x {steps}")
    out = np.ones((steps, groups))
    if spec.kind == "persistent":
        for g, f in spec.persistent:
            _check_group(spec, g, groups)
            out[:, g] = f
    elif spec.kind == "bursty":
        out = _bursty(groups, steps, spec.seed)
    elif spec.kind == "rotating":
        rng = np.random.default_rng(seed)
        hit = rng.random(steps) < spec.prob
        who = rng.integers(0, groups, steps)
        out[np.flatnonzero(hit), who[hit]] = ROTATING_FACTOR
    else:
        for step, g, f in sorted(spec.rows, key=lambda r: r[0]):
            _check_group(spec, g, groups)
            if step < steps:
                out[step:, g] = f
    return out


def _check_group(spec: StragglerSpec, g: int, groups: int) -> None:
    if not 0 <= g < groups:
        raise ValueError(f"--stragglers {spec.text!r}: group {g} outside [0, {groups})")


def _bursty(groups: int, steps: int, seed: int, rho: float = 0.9, sigma: float = 0.05,
            burst_rate: float = 0.02, burst_len: int = 20, burst_level: float = 1.5) -> np.ndarray:
    """AR(1) background load plus bursts: each step a burst starts on a random group with
    probability ``burst_rate * groups`` (capped at 1) and adds ``burst_level`` (x the base step,
    so a 2.5x step) for ``burst_len`` steps, ramping up over 3 steps and down over 3."""
    rng = np.random.default_rng(seed)
    load = np.zeros((steps, groups))
    x = np.zeros(groups)
    for s in range(steps):
        x = rho * x + rng.normal(0.0, sigma, groups)
        load[s] = np.abs(x)
    ramp = np.minimum(1.0, np.minimum(np.arange(1, burst_len + 1),
                                      np.arange(burst_len, 0, -1)) / 3.0)
    starts = rng.random(steps) < min(1.0, burst_rate * groups)
    who = rng.integers(0, groups, steps)
    for s in np.flatnonzero(starts):
        end = min(steps, s + burst_len)
        load[s:end, who[s]] += burst_level * ramp[:end - s]
    return 1.0 + load


def straggler_frequency(times: np.ndarray, ratio: float = STRAGGLER_RATIO) -> float:
    """Share of steps (rows) on which some group takes more than ``ratio`` x the fastest."""
    t = np.asarray(times, dtype=float)
    if t.ndim != 2 or t.size == 0:
        raise ValueError(f"expected a (steps, groups) array, got shape {t.shape}")
    return float(np.mean(t.max(axis=1) > ratio * t.min(axis=1)))
