"""Straggler traces: which group is how many times slower at which step, and what a run's
measured step times say about stragglers (STAR, ../shared/reference/star.md sections 1, 3, 8).

A trace is written ``--stragglers SPEC``:

==========================  ===================================================================
``persistent:G@F``          group G is F times slower at every step (F >= 1); a comma-separated
                            list names several (``persistent:1@1.5,persistent:3@3``)
``bursty:SEED``             every group's load is an AR(1) process (mild jitter) with bursts:
                            each step a burst starts with probability 5 % on a random group and
                            lasts a geometric number of steps (mean 10), 1.5-3x slower; SEED
                            seeds it (the run's seed does not)
``rotating:P[@F]``          each step one random group is F times slower (default 2) with
                            probability P in [0, 1], seeded by the run's seed
a CSV file                  ``step,group,slowdown`` rows, one row per change: the slowdown
                            (>= 1.0) holds from that step until the next row for that group
                            (before its first row a group runs at 1.0); an optional header
                            ``step,group,slowdown``, blank lines and ``#`` comments are skipped
``none``                    no stragglers
==========================  ===================================================================

Patterns may be combined with commas (the factors multiply); a CSV file stands alone. "Group" is
the process that starts in that layout slot (its uid): a straggler is a slow *machine* (STAR:
uneven CPU and network use on the node), so a warm spare that replaces it runs at full speed,
and spares (uids >= groups) are never slowed.

Pure: no I/O, no clock. The CSV's text comes in as a string (the caller reads the file), and a
group's factors are a pure function of (trace, group, steps, seed), so every worker computes its
own without talking to the others. Bad input is a :class:`StragglerSpecError` (a ValueError)
whose one-line message names the bad value (and the CSV line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

__all__ = ["StragglerSpecError", "Trace", "parse_stragglers", "is_pattern", "PATTERNS",
           "straggler_frequency", "time_to_target", "running_mean", "data_step_loss_points",
           "STRAGGLER_RATIO"]

PATTERNS = ("persistent", "bursty", "rotating")
#: STAR's straggler: a group more than 20 % slower than the fastest one at that step
STRAGGLER_RATIO = 1.2
#: bursty: AR(1) coefficient and innovation of the load, burst start probability per step,
#: mean burst length (steps) and the burst's slowdown range
_AR_PHI, _AR_SIGMA = 0.9, 0.03
_BURST_P, _BURST_MEAN, _BURST_LO, _BURST_HI = 0.05, 10.0, 1.5, 3.0
_ROTATING_F = 2.0
_EXPECTED = "expected persistent:G@F, bursty:SEED, rotating:P[@F], 'none' or a CSV file"


class StragglerSpecError(ValueError):
    """A straggler trace that cannot be run; the message names the bad value."""


@dataclass(frozen=True)
class Trace:
    """A parsed straggler trace for ``groups`` groups. ``persistent``: group -> factor;
    ``bursty``: the burst seed or None; ``rotating``: (P, F) or None; ``changes``: a CSV's
    rows (step, group, factor) in file order."""

    groups: int
    persistent: tuple[tuple[int, float], ...] = ()
    bursty: int | None = None
    rotating: tuple[float, float] | None = None
    changes: tuple[tuple[int, int, float], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.persistent or self.changes) and self.bursty is None \
            and self.rotating is None

    def column(self, group: int, steps: int, seed: int = 0) -> list[float]:
        """The factor (>= 1.0) of ``group`` at steps ``0..steps-1``; all 1.0 for a uid outside
        the layout (a spare). ``seed``: the run's seed (``rotating`` draws from it)."""
        out = np.ones(steps)
        if not 0 <= group < self.groups or steps <= 0:
            return out.tolist()
        for g, f in self.persistent:
            if g == group:
                out *= f
        if self.changes:
            out *= _held(self.changes, group, steps)
        if self.rotating is not None:
            p, f = self.rotating
            rng = np.random.default_rng([int(seed), 0x5707])
            hit = rng.random(steps) < p
            who = rng.integers(0, self.groups, size=steps)
            out[hit & (who == group)] *= f
        if self.bursty is not None:
            out *= _bursty(self.bursty, group, self.groups, steps)
        return out.tolist()

    def matrix(self, steps: int, seed: int = 0) -> list[list[float]]:
        """Every group's factors: ``matrix[step][group]`` (tests, plan)."""
        cols = [self.column(g, steps, seed) for g in range(self.groups)]
        return [list(r) for r in zip(*cols)] if cols else []


def _held(changes: Sequence[tuple[int, int, float]], group: int, steps: int) -> np.ndarray:
    out = np.ones(steps)
    for step, g, f in sorted((c for c in changes if c[1] == group), key=lambda c: c[0]):
        if step < steps:
            out[step:] = f  # a later row for the group overrides from its step on
    return out


def _bursty(seed: int, group: int, groups: int, steps: int) -> np.ndarray:
    """AR(1) load per group (its own stream) times the bursts (one stream shared by all
    groups, so the burst that hits group g is the same draw in every worker)."""
    rng = np.random.default_rng([int(seed), 0xB0, group])
    eps = rng.normal(0.0, _AR_SIGMA, size=steps)
    load = np.empty(steps)
    x = 0.0
    for i in range(steps):
        x = _AR_PHI * x + eps[i]
        load[i] = x
    out = 1.0 + np.abs(load)
    brng = np.random.default_rng([int(seed), 0xB1])
    start = brng.random(steps) < _BURST_P
    who = brng.integers(0, groups, size=steps)
    length = brng.geometric(1.0 / _BURST_MEAN, size=steps)
    factor = brng.uniform(_BURST_LO, _BURST_HI, size=steps)
    for s in np.flatnonzero(start & (who == group)):
        seg = out[s:s + int(length[s])]
        np.maximum(seg, factor[s], out=seg)
    return out


def is_pattern(spec: str) -> bool:
    """True when ``spec`` is a built-in pattern (or ``none``), False when it names a CSV file;
    an unknown ``word:...`` that is no file is the caller's to report (``parse_stragglers``
    with ``csv_text=None`` does)."""
    s = spec.strip()
    if s == "none":
        return True
    head = s.split(",", 1)[0].split(":", 1)[0].strip()
    return ":" in s.split(",", 1)[0] and head in PATTERNS


def parse_stragglers(spec: str, groups: int, csv_text: str | None = None) -> Trace:
    """``spec`` -> a :class:`Trace`. A CSV file's contents come as ``csv_text`` (``spec`` is
    then its name, for the messages); ``csv_text=None`` means ``spec`` must be a pattern."""
    name = f"--stragglers {spec!r}"
    if csv_text is not None:
        return Trace(groups, changes=_parse_csv(csv_text, groups, spec))
    s = spec.strip()
    if not s:
        raise StragglerSpecError(f"{name}: empty ({_EXPECTED})")
    if s == "none":
        return Trace(groups)
    persistent: dict[int, float] = {}
    bursty = rotating = None
    for item in (x.strip() for x in s.split(",")):
        kind, sep, arg = item.partition(":")
        kind = kind.strip()
        if not sep or kind not in PATTERNS:
            raise StragglerSpecError(f"{name}: unknown pattern {item!r} ({_EXPECTED})")
        arg = arg.strip()
        if kind == "persistent":
            g_text, at, f_text = arg.partition("@")
            g = _int(g_text, f"{name}: persistent group {g_text!r}")
            f = _float(f_text, f"{name}: persistent factor {f_text!r}") if at else None
            if f is None:
                raise StragglerSpecError(f"{name}: {item!r} needs a factor (persistent:G@F)")
            _group(g, groups, name)
            _factor(f, f"{name}: persistent factor {f_text!r}")
            if g in persistent:
                raise StragglerSpecError(f"{name}: group {g} is given twice")
            persistent[g] = f
        elif kind == "bursty":
            if bursty is not None:
                raise StragglerSpecError(f"{name}: bursty is given twice")
            bursty = _int(arg, f"{name}: bursty seed {arg!r}")
            if bursty < 0:
                raise StragglerSpecError(f"{name}: bursty seed {bursty} must be >= 0")
        else:
            if rotating is not None:
                raise StragglerSpecError(f"{name}: rotating is given twice")
            p_text, at, f_text = arg.partition("@")
            p = _float(p_text, f"{name}: rotating probability {p_text!r}")
            if not 0.0 <= p <= 1.0:
                raise StragglerSpecError(f"{name}: rotating probability {p_text.strip()} is "
                                         f"not in [0, 1]")
            f = _float(f_text, f"{name}: rotating factor {f_text!r}") if at else _ROTATING_F
            _factor(f, f"{name}: rotating factor {f_text!r}")
            rotating = (p, f)
    return Trace(groups, persistent=tuple(sorted(persistent.items())), bursty=bursty,
                 rotating=rotating)


def _parse_csv(text: str, groups: int, where: str) -> tuple[tuple[int, int, float], ...]:
    rows = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if [c.lower() for c in cells] == ["step", "group", "slowdown"] and not rows:
            continue  # the header
        at = f"--stragglers {where} line {n}"
        if len(cells) != 3:
            raise StragglerSpecError(f"{at}: {raw.strip()!r} is not step,group,slowdown")
        step = _int(cells[0], f"{at}: step {cells[0]!r}")
        if step < 0:
            raise StragglerSpecError(f"{at}: step {step} must be >= 0")
        g = _int(cells[1], f"{at}: group {cells[1]!r}")
        _group(g, groups, at)
        f = _float(cells[2], f"{at}: slowdown {cells[2]!r}")
        _factor(f, f"{at}: slowdown {cells[2]!r}")
        rows.append((step, g, f))
    return tuple(rows)


def _int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise StragglerSpecError(f"{what} is not an integer") from None


def _float(text: str, what: str) -> float:
    try:
        v = float(text.strip())
    except ValueError:
        raise StragglerSpecError(f"{what} is not a number") from None
    if not math.isfinite(v):
        raise StragglerSpecError(f"{what} is not a finite number")
    return v


def _group(g: int, groups: int, what: str) -> None:
    if not 0 <= g < groups:
        raise StragglerSpecError(f"{what}: group {g} is not in 0..{groups - 1} "
                                 f"({groups} groups)")


def _factor(f: float, what: str) -> None:
    if f < 1.0:
        raise StragglerSpecError(f"{what} is below 1.0 (a slowdown: 1.0 is full speed)")


# ---------------------------------------------------------------------- measured quantities
def straggler_frequency(step_times_per_group: Mapping[int, Mapping[int, float]]) -> float | None:
    """STAR's straggler frequency: the share of steps at which some group's step time is more
    than 1.2x the fastest group's. ``step_times_per_group``: step -> {group: seconds}; steps
    with fewer than two groups (or a non-positive fastest time) are not counted. None when no
    step counts."""
    counted = hit = 0
    for times in step_times_per_group.values():
        ts = [float(t) for t in times.values()]
        if len(ts) < 2 or min(ts) <= 0:
            continue
        counted += 1
        hit += max(ts) > STRAGGLER_RATIO * min(ts)
    return hit / counted if counted else None


def time_to_target(losses: Sequence[tuple[float, float]], target: float,
                   t0: float) -> float | None:
    """Time-to-accuracy: seconds from ``t0`` to the first (time, committed loss) at or below
    ``target``, in time order; None when it is never reached (or ``losses`` is empty).
    A non-finite loss never counts."""
    for t, loss in sorted(losses):
        if math.isfinite(loss) and loss <= target:
            return t - t0
    return None


def running_mean(points: Sequence[tuple[float, float]], window: int
                 ) -> list[tuple[float, float]]:
    """(time, mean loss of the last ``window`` points) in time order, from the ``window``-th
    point on: a per-step loss is one global batch's and noisy, so a target taken from one
    run's curve is better met by a smoothed curve than by the first lucky batch. Non-finite
    losses are dropped first."""
    if window < 1:
        raise ValueError(f"window {window} must be at least 1")
    pts = sorted((t, v) for t, v in points if math.isfinite(v))
    out, acc = [], 0.0
    for i, (t, v) in enumerate(pts):
        acc += v
        if i >= window:
            acc -= pts[i - window][1]
        if i >= window - 1:
            out.append((t, acc / window))
    return out


def data_step_loss_points(commits: Sequence[Mapping]) -> dict[int, tuple[float, float]]:
    """Each data step's (time, loss) from commit events (``step``, ``t``, ``loss``, optional
    ``data_losses``), the first commit of a step counting: what TTA and a final loss are
    judged by in every sync mode. A commit with ``data_losses`` (a mode that defers samples:
    ``ksync``) gives the data steps it completed, timed at it, instead of its own loss over
    fewer than N shards (:func:`unbroken.core.sync.data_step_losses` says why); any other
    gives its own step's loss."""
    first: dict[int, Mapping] = {}
    for e in commits:
        k = e.get("step")
        if isinstance(k, int) and isinstance(e.get("t"), (int, float)) and (
                k not in first or e["t"] < first[k]["t"]):
            first[k] = e
    out: dict[int, tuple[float, float]] = {}
    for k in sorted(first):
        e = first[k]
        pairs = e["data_losses"] if "data_losses" in e else [[k, e.get("loss")]]
        for s, loss in pairs:
            if isinstance(loss, (int, float)) and int(s) not in out:
                out[int(s)] = (float(e["t"]), float(loss))
    return out
