"""The aligned metric grid every reader produces and every analysis consumes.

Why a grid: the peer-relative detector compares each node with its peers *at the same scrape*,
so samples from files or from a server are put on one time axis (the scrape interval, found as
the median spacing) and one node axis first. A sample lands in the slot nearest its timestamp;
a slot without a sample is NaN (absent), never zero — absence is information (a node that
stopped reporting is not a node whose counters stopped).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from unbroken.learn import names

__all__ = ["Frame", "build_frame"]

Key = tuple[str, str]  # (metric name, value of its key label or '')


@dataclass
class Frame:
    t: np.ndarray                      # (T,) scrape times, epoch seconds, evenly spaced
    nodes: list[str]                   # (N,) node names, sorted
    series: dict[Key, np.ndarray]      # (metric, label) -> (N, T) float64, NaN where absent
    warnings: list[str] = field(default_factory=list)

    @property
    def dt(self) -> float:
        return float(self.t[1] - self.t[0]) if len(self.t) > 1 else 30.0

    def labels(self, name: str) -> list[str]:
        return sorted(lab for (n, lab) in self.series if n == name)

    def get(self, name: str, label: str = "") -> np.ndarray | None:
        return self.series.get((name, label))

    def stack(self, name: str) -> np.ndarray | None:
        """All series of ``name`` as (L, N, T) (one per label value), None if absent."""
        labs = self.labels(name)
        if not labs:
            return None
        return np.stack([self.series[(name, lab)] for lab in labs])


def build_frame(samples: Mapping[tuple[str, str, str], tuple[Iterable[float], Iterable[float]]],
                dt: float | None = None, start: float | None = None,
                end: float | None = None) -> Frame:
    """Samples keyed by (metric, node, label) as (timestamps, values) -> a Frame.

    Collisions after label reduction are the reader's business (it sums or averages before
    calling). ``dt`` defaults to the median spacing of the densest series; ``start``/``end``
    clip the axis. Raises ValueError when nothing is left.
    """
    arrays = {k: (np.asarray(ts, float), np.asarray(vs, float)) for k, (ts, vs) in samples.items()}
    arrays = {k: v for k, v in arrays.items() if len(v[0])}
    if not arrays:
        raise ValueError("no samples in the input")
    if dt is None:
        steps = [np.median(np.diff(np.sort(ts))) for ts, _ in arrays.values() if len(ts) > 2]
        dt = float(np.median(steps)) if steps else 30.0
        if not dt > 0:
            dt = 30.0
    lo = min(float(ts.min()) for ts, _ in arrays.values())
    hi = max(float(ts.max()) for ts, _ in arrays.values())
    if start is not None:
        lo = max(lo, start)
    if end is not None:
        hi = min(hi, end)
    if hi < lo:
        raise ValueError(f"empty time range: no samples between {start} and {end}")
    t0 = np.floor(lo / dt) * dt if start is None else lo
    T = int(round((hi - t0) / dt)) + 1
    t = t0 + dt * np.arange(T)
    nodes = sorted({node for (_, node, _) in arrays})
    idx = {n: i for i, n in enumerate(nodes)}
    series: dict[Key, np.ndarray] = {}
    for (name, node, lab), (ts, vs) in arrays.items():
        grid = series.get((name, lab))
        if grid is None:
            grid = series[(name, lab)] = np.full((len(nodes), T), np.nan)
        slot = np.rint((ts - t0) / dt).astype(np.int64)
        ok = (slot >= 0) & (slot < T) & np.isfinite(vs)
        grid[idx[node], slot[ok]] = vs[ok]
    return Frame(t=t, nodes=nodes, series=series)


def reduce_labels(name: str, labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(node, key label value) of a series, or None when it has no ``instance``."""
    inst = labels.get("instance")
    if inst is None:
        return None
    return names.node_of(inst), labels.get(names.key_label(name), "")
