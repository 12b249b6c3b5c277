"""Signals to the change detector's evidence, and a synthetic cluster to a fitting case.

Why a module between ``learn.signals`` and ``core.changepoint``: the analysis, ``learn fit`` and
the held-out bench all need the same steps — who is a peer when (sacct's session membership,
else every reporting node), each signal's peer z and deviation from its own baseline computed
once, then the clipped CUSUM for one or several (k, cap) — and the fit and the bench need the
truth turned into failures and a healthy mask. Doing it in one place is what makes the bench's
numbers the analysis's numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unbroken.core import changepoint as C
from unbroken.core.changefit import FitCase
from unbroken.core.precursors import Failure
from unbroken.learn.signals import Signals, build_signals

__all__ = ["live_mask", "evidences", "truth_failures", "null_mask", "synth_cases",
           "LEAD_EARLY_S"]

LEAD_EARLY_S = 300.0      # a precursor at least this far ahead can warn before its XID


def live_mask(sig: Signals, nodes: list[str], t: np.ndarray, attempts=None
              ) -> tuple[np.ndarray, str | None]:
    """(N, T) who is a peer when: reporting, and in the session when sacct says so; a
    warning when sacct covers none of the time range."""
    live = sig.present.copy()
    if attempts:
        from unbroken.learn.sacct import membership
        mem = membership(attempts, nodes, t)
        if mem.any():
            return live & mem, None
        return live, ("sacct: no job overlaps the metrics' time range; every reporting node "
                      "is a peer")
    return live, None


def evidences(sig: Signals, live: np.ndarray, base: C.ChangePolicy,
              variants: Sequence[tuple[float, float]], only: Sequence[str] | None = None,
              dtype=np.float32) -> dict[tuple[float, float], dict[str, np.ndarray]]:
    """Per (k, cap): signal -> (N, T) CUSUM of the node's worst unit. The peer z and the
    deviation are computed once per signal."""
    N = live.shape[0]
    ok_t = live.sum(axis=0) >= base.min_peers + 1
    out: dict = {v: {} for v in variants}
    for s, x in sig.values.items():
        if only is not None and s not in only:
            continue
        nd = sig.node_of[s]
        z, level = C.peer_z(x, live[nd], sig.floor[s], base.rel_floor, ok_t)
        r = C.deviation(z, base, C.regimes(level, sig.floor[s]))
        del z
        for (k, cap) in variants:
            S = C.clipped_cusum(r, k, cap, sig.sides[s])
            ev = C.node_evidence(S, nd, N)
            out[(k, cap)][s] = np.minimum(ev, np.finfo(dtype).max).astype(dtype)
    return out


def truth_failures(truth: dict, nodes: list[str]) -> list[Failure]:
    idx = {n: i for i, n in enumerate(nodes)}
    return [Failure(idx[f["node"]], float(f["xid_time"])) for f in truth["failures"]]


def null_mask(truth: dict, nodes: list[str], t: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Live node-time known healthy: every failing node masked from an hour before its
    precursor (or its XID) to two hours after its XID."""
    idx = {n: i for i, n in enumerate(nodes)}
    null = live.copy()
    for f in truth["failures"]:
        lo = min(float(f["precursor_onset"]), float(f["xid_time"])) - 3600.0
        null[idx[f["node"]], (t >= lo) & (t <= float(f["xid_time"]) + 7200.0)] = False
    return null


def synth_cases(s, base: C.ChangePolicy, variants: Sequence[tuple[float, float]],
                dtype=np.float32) -> dict[tuple[float, float], FitCase]:
    """A generated cluster (``learn.synth.Synth``) as one fitting case per (k, cap)."""
    from unbroken.learn.sacct import parse_sacct
    from unbroken.learn.synth import sacct_lines

    frame = s.frame
    sig = build_signals(frame)
    jobs, _ = parse_sacct(sacct_lines(s))
    live, _ = live_mask(sig, frame.nodes, frame.t, jobs)
    ev = evidences(sig, live, base, variants, dtype=dtype)
    fails = truth_failures(s.truth, frame.nodes)
    null = null_mask(s.truth, frame.nodes, frame.t, live)
    early = sum(1 for f in s.truth["failures"] if f["precursor_lead_s"] > LEAD_EARLY_S)
    return {v: FitCase(evidence=ev[v], t=frame.t, failures=fails, null=null,
                       early_possible=early) for v in variants}
