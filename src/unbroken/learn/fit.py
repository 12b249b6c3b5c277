"""``unbroken learn fit``: fit the change detector on synthetic clusters, write the detector file.

Why synthetic clusters: fitting needs failures whose precursors are known (when they start,
which signals they move), and a cluster's own history does not say that. ``learn synth``'s
generator does, for several precursor families (``learn.synth_shapes``); the fit sees
``--families`` at ``--seeds`` and never the cluster that ``learn --detector FILE`` will score.
Leaving a family out of ``--families`` is how the held-out bench (``bench/learn_heldout.py``)
tests shapes the detector was not fitted on.

Per cluster: signals, session peers (sacct), each signal's evidence under every (k, cap) of the
grid (``learn.evidence``); then ``core.changefit.fit_detector`` to ``--fp-budget`` false
alarms per day, and the peer-band rules (``core.precursors.calibrate``) on the same clusters'
healthy node-time for ``learn rules``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from unbroken.core import precursors as P
from unbroken.core.changefit import fit_detector
from unbroken.core.changepoint import ChangePolicy
from unbroken.learn.detector import Detector, write_detector
from unbroken.learn.evidence import synth_cases
from unbroken.learn.signals import SIGNALS, build_signals
from unbroken.learn.synth import FAMILIES, SynthSpec, TooShort, generate

__all__ = ["FitSpec", "VARIANTS", "fit", "fit_command", "cluster_spec", "parse_seeds",
           "parse_families"]

VARIANTS = ((1.0, 6.0), (1.5, 6.0), (2.0, 6.0))
SEED_RETRY = 10_000        # a seed whose failures do not fit --days moves on by this much


@dataclass(frozen=True)
class FitSpec:
    families: tuple[str, ...] = FAMILIES
    seeds: tuple[int, ...] = (1000, 1001, 1002, 1003)
    nodes: int = 24
    days: float = 2.0
    gpus: int = 8
    failures: int = 10
    early: int = 3
    silent: int = 2
    budget_per_day: float = 1.0
    margin: float = 0.75
    variants: tuple = VARIANTS
    base: ChangePolicy = field(default_factory=ChangePolicy)


def cluster_spec(family: str, seed: int, nodes: int, days: float, gpus: int, failures: int,
                 early: int, silent: int) -> SynthSpec:
    """The synthetic cluster the fit and the held-out bench use: one training session, no
    failures without an XID (they would only take time from a 2-day cluster)."""
    return SynthSpec(seed=seed, nodes=nodes, days=days, gpus=gpus, failures=failures,
                     before=early, silent=silent, other_failures=0, shapes=family)


def generate_fitting(spec: SynthSpec):
    """``generate``, moving the seed on (by ``SEED_RETRY``) when the failures do not fit."""
    for k in range(5):
        try:
            return generate(SynthSpec(**{**asdict(spec), "seed": spec.seed + k * SEED_RETRY}))
        except TooShort:
            continue
    raise ValueError(f"seed {spec.seed}: no cluster of {spec.failures} failures fits "
                     f"{spec.days:g} days; give --days more")


def _rules_rows(s, budget: float) -> list[P.CalibrationRow]:
    from unbroken.learn.evidence import live_mask, null_mask
    from unbroken.learn.sacct import parse_sacct
    from unbroken.learn.synth import sacct_lines

    sig = build_signals(s.frame, band=True)
    jobs, _ = parse_sacct(sacct_lines(s))
    live, _ = live_mask(sig, s.frame.nodes, s.frame.t, jobs)
    null = null_mask(s.truth, s.frame.nodes, s.frame.t, live)
    base = P.DetectorPolicy()
    st = {k: P.peer_stats(v, null, base, sig.floor[k]) for k, v in sig.values.items()}
    return P.calibrate(st, sig.family, s.frame.t, budget, base)[1]


def _rules_policy(per_cluster: list[list[P.CalibrationRow]], budget: float
                  ) -> tuple[P.DetectorPolicy, str]:
    """The first setting (calibrate's sensitivity order) whose mean false alarms per day over
    the clusters' healthy node-time meet the budget; else the quietest."""
    n = len(per_cluster[0])
    mean = [float(np.mean([rows[i].false_alarms_per_day for rows in per_cluster]))
            for i in range(n)]
    ok = [i for i in range(n) if mean[i] <= budget]
    i = ok[0] if ok else int(np.argmin(mean))
    r = per_cluster[0][i]
    pol = P.DetectorPolicy(z=r.z, persist=r.persist, families=r.families)
    return pol, (f"z {r.z:g}, persist {r.persist}, {r.families} families: {mean[i]:.2f} "
                 f"false alarms/day on the fitting clusters' healthy node-time")


def fit(spec: FitSpec, progress: Callable[[str], None] | None = None,
        rules: bool = True) -> Detector:
    """Generate the fitting clusters, fit, return the detector (not yet written)."""
    cases: dict = {v: [] for v in spec.variants}
    band_rows, used = [], []
    for fam in spec.families:
        for seed in spec.seeds:
            s = generate_fitting(cluster_spec(fam, seed, spec.nodes, spec.days, spec.gpus,
                                              spec.failures, spec.early, spec.silent))
            used.append([fam, s.spec.seed])
            for v, c in synth_cases(s, spec.base, spec.variants, dtype=np.float16).items():
                cases[v].append(c)
            if rules:
                band_rows.append(_rules_rows(s, spec.budget_per_day))
            if progress:
                progress(f"fitting cluster {len(used)}/{len(spec.families) * len(spec.seeds)}: "
                         f"{fam} seed {s.spec.seed}")
    family_of = {k: SIGNALS[k][0] for k in SIGNALS}
    pol, rows, why = fit_detector(cases, family_of, spec.budget_per_day, spec.base,
                                  margin=spec.margin)
    rules_pol, rules_why = (_rules_policy(band_rows, spec.budget_per_day) if rules
                            else (P.DetectorPolicy(), "default peer-band rules (not fitted)"))
    fitted = {"families": list(spec.families), "clusters": used, "nodes": spec.nodes,
              "days": spec.days, "gpus": spec.gpus, "failures": spec.failures,
              "early": spec.early, "silent": spec.silent,
              "budget_per_day": spec.budget_per_day, "margin": spec.margin, "reason": why,
              "rules_reason": rules_why, "grid": [asdict(r) for r in rows]}
    sigs = {k: {"family": SIGNALS[k][0], "floor": SIGNALS[k][1], "sides": SIGNALS[k][2]}
            for k in pol.thresholds}
    return Detector(policy=pol, signals=sigs, scrape_s=30.0, fitted_on=fitted, rules=rules_pol)


def parse_seeds(text: str) -> tuple[int, ...]:
    """'1000-1003' or '5,9,12' -> seeds; ValueError naming the text."""
    try:
        if "-" in text.strip("-"):
            a, b = text.split("-", 1)
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ValueError
            return tuple(range(lo, hi + 1))
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected A-B or a comma list of integers") from None
    if not out or min(out) < 0:
        raise ValueError(f"--seeds {text!r}: expected integers >= 0")
    return out


def parse_families(text: str) -> tuple[str, ...]:
    out = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in out if x not in FAMILIES]
    if bad or not out:
        raise ValueError(f"--families {text!r}: expected a comma list of "
                         f"{', '.join(FAMILIES)}")
    return out


def fit_command(a: argparse.Namespace) -> dict:
    spec = FitSpec(families=parse_families(a.families), seeds=parse_seeds(a.seeds),
                   nodes=a.nodes, days=a.days, gpus=a.gpus, failures=a.failures,
                   early=a.early, silent=a.silent, budget_per_day=a.fp_budget,
                   margin=a.margin)
    SynthSpec(nodes=spec.nodes, days=spec.days, gpus=spec.gpus, failures=spec.failures,
              before=spec.early, silent=spec.silent).check()
    det = fit(spec)
    digest = write_detector(det, a.out)
    return {"action": "fit", "out": a.out, "sha256": digest, "reason": det.fitted_on["reason"],
            "rules_reason": det.fitted_on["rules_reason"],
            "policy": {k: v for k, v in asdict(det.policy).items()},
            "clusters": len(det.fitted_on["clusters"]), "families": list(spec.families)}
