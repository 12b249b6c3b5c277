"""STAR's ML mode selector: a small network from (predicted step times, noise scale) to a mode.

Why and how it is trained here
------------------------------
STAR trains its selector on logged (features -> best mode) decisions so a decision costs one
forward pass instead of the cost model's Monte-Carlo. Its features were the predicted worker
times (and, for its SSGD/ASGD classifier, the straggling degree, a model one-hot, learning rate
and step). Ours: the **sorted predicted per-group step times divided by the fastest**, the noise
scale as log(1 + phi / B), and N. A model is trained for one N (the feature vector has N times).

Labels: the mode the **heuristic's own cost model** (``core.sync.select``) chooses on
**simulated** straggler profiles (a quiet cluster, one or two persistent stragglers, a bursty
window, rotating slow groups, at a noise scale drawn log-uniformly) -- not measured runs: the
bench's runs are too few to train on. So the network learns to imitate the heuristic; what it
buys is decision time, and :func:`compare` measures what it costs on held-out profiles: the
share of profiles where it picks the heuristic's mode and the TTA regret of its pick under the
same cost model (and both against the best mode in hindsight).

Two kinds: ``runtime=True`` (what ``unbroken run --sync auto --selector FILE`` decides with)
labels by the runtime's own model (``CostModel.for_runtime``: ksync priced as deferral, the
15 % rule to leave sync) among the modes the runtime's ``auto`` may choose
(``core.sync.AUTO_MODES``); the default labels by STAR's model among every mode (the
planner's comparison). A model file says which it is (``meta["for"]``).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from unbroken.core.sync import AUTO_MODES, MODES, CostModel, select
from unbroken.core.sync import tta_of as core_tta_of
from unbroken.runtime.mlselector import MLSelector, classes_for, features, selector_net
from unbroken.sync.trace import slowdowns

__all__ = ["classes_for", "features", "simulate_profiles", "label", "train_selector",
           "MLSelector", "compare", "tta_of"]


def simulate_profiles(n: int, groups: int, seed: int, base_s: float = 1.0
                      ) -> list[tuple[np.ndarray, float]]:
    """``n`` (predicted step times, phi) pairs from simulated straggler profiles."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            slow = np.ones(groups)
        elif kind in (1, 2):
            slow = np.ones(groups)
            who = rng.choice(groups, size=kind, replace=False)
            slow[who] = rng.uniform(1.1, 3.5, size=kind)
        elif kind == 3:
            slow = slowdowns(f"bursty:{int(rng.integers(1 << 30))}", groups, 60)[30:].mean(0)
        else:
            slow = slowdowns(f"rotating:{rng.uniform(0.2, 0.9):.3f}", groups, 30,
                             seed=int(rng.integers(1 << 30))).mean(0)
        t = base_s * slow * (1 + np.abs(rng.normal(0, 0.02, groups)))
        phi = float(np.exp(rng.uniform(np.log(1.0), np.log(4096.0))))
        out.append((t, phi))
    return out


#: every mode but auto: what the STAR-model selector chooses among
_EVERY = tuple(m for m in MODES if m != "auto")


def label(times: np.ndarray, phi: float, cm: CostModel, allowed=_EVERY,
          greedy_mask: bool = False) -> str:
    return select(times, replace(cm, noise_scale=phi), allowed=allowed,
                  greedy_mask=greedy_mask).mode


def _allowed(meta: dict) -> tuple[str, ...]:
    return tuple(meta.get("allowed", _EVERY))


def _cost_model(meta: dict, seed: int) -> CostModel:
    """The model the selector was labelled with (another seed for held-out profiles)."""
    c = meta["cost_model"]
    if meta.get("for") == "runtime":
        return CostModel.for_runtime(meta["shard_batch"], c["redundancy"], comm_s=c["comm_s"],
                                     seed=seed, cores=c.get("cores", 0))
    return CostModel(redundancy=c["redundancy"], comm_s=c["comm_s"],
                     staleness_cost=c["staleness_cost"], mc_updates=c["mc_updates"],
                     shard_batch=meta["shard_batch"], seed=seed)


def tta_of(mode: str, times: np.ndarray, phi: float, cm: CostModel,
           greedy_mask: bool = False) -> float:
    """The cost model's TTA (s per sync-equivalent step) of ``mode`` at noise scale ``phi``."""
    return core_tta_of(mode, times, replace(cm, noise_scale=phi), greedy_mask)


def train_selector(groups: int = 8, n: int = 2000, seed: int = 0, cm: CostModel | None = None,
                   epochs: int = 300, runtime: bool = False, shard_batch: int = 8,
                   redundancy: int = 2, cores: int = 0) -> MLSelector:
    """Label ``n`` simulated profiles with the heuristic and fit the MLP (full batch, Adam,
    cross-entropy), seeded. ``runtime``: label as the runtime's ``auto`` decides (its cost
    model, its modes, ``greedy_mask``), for a job of ``shard_batch`` and ``redundancy`` whose
    groups share ``cores`` CPU cores (0: a device each; ``CostModel.cores``)."""
    import torch

    if runtime:
        cm = cm or CostModel.for_runtime(shard_batch, redundancy, seed=seed, cores=cores)
        allowed, greedy = AUTO_MODES, True
    else:
        cm = cm or CostModel(redundancy=2, comm_s=0.1, mc_updates=200, seed=seed)
        allowed, greedy = _EVERY, False
    classes = classes_for(groups)
    t0 = time.perf_counter()
    prof = simulate_profiles(n, groups, seed)
    x = np.stack([features(t, phi, cm.shard_batch) for t, phi in prof])
    y = np.array([classes.index(label(t, phi, cm, allowed, greedy)) for t, phi in prof])
    label_s = time.perf_counter() - t0
    mean, std = x.mean(0), x.std(0)
    std = np.where(std > 0, std, 1.0)
    torch.manual_seed(seed)
    net = selector_net(x.shape[1], len(classes))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    yt = torch.tensor(y)
    for _ in range(epochs):
        loss = torch.nn.functional.cross_entropy(net(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    counts = {c: int(np.sum(y == i)) for i, c in enumerate(classes) if np.any(y == i)}
    meta = {"kind": "selector", "for": "runtime" if runtime else "star",
            "allowed": list(allowed), "groups": groups, "classes": classes,
            "shard_batch": cm.shard_batch, "mean": mean.tolist(), "std": std.tolist(),
            "cost_model": {"comm_s": cm.comm_s, "redundancy": cm.redundancy, "cores": cm.cores,
                           "staleness_cost": cm.staleness_cost, "mc_updates": cm.mc_updates},
            "labels": "heuristic on simulated profiles", "examples": n, "label_counts": counts,
            "train_loss": loss.item(), "seed": seed, "label_s": round(label_s, 3),
            "train_s": round(time.perf_counter() - t0 - label_s, 3)}
    return MLSelector({k: v.detach().clone() for k, v in net.state_dict().items()}, meta, net)


def compare(sel: MLSelector, n: int = 500, seed: int = 1, cm: CostModel | None = None) -> dict:
    """The ML selector against the heuristic on ``n`` held-out simulated profiles (another seed
    than training): ``agreement`` (share of profiles where both pick the same mode),
    ``regret_mean`` / ``regret_max`` (TTA of the ML pick over the heuristic's pick, minus 1)
    and each one's mean regret against the best mode in hindsight."""
    meta = sel.meta
    cm = cm or _cost_model(meta, seed)
    allowed, greedy = _allowed(meta), meta.get("for") == "runtime"
    agree, regret, h_oracle, m_oracle = 0, [], [], []
    t0 = time.perf_counter()
    for t, phi in simulate_profiles(n, meta["groups"], seed):
        h = label(t, phi, cm, allowed, greedy)
        m, _ = sel.choose(t, phi, allowed)
        agree += m == h
        th, tm = tta_of(h, t, phi, cm, greedy), tta_of(m, t, phi, cm, greedy)
        best = min(tta_of(c, t, phi, cm, greedy) for c in meta["classes"]
                   if c.split(":")[0] in allowed)
        regret.append(tm / th - 1)
        h_oracle.append(th / best - 1)
        m_oracle.append(tm / best - 1)
    return {"profiles": n, "agreement": agree / n, "regret_mean": float(np.mean(regret)),
            "regret_max": float(np.max(regret)),
            "heuristic_vs_hindsight": float(np.mean(h_oracle)),
            "ml_vs_hindsight": float(np.mean(m_oracle)),
            "wall_s": round(time.perf_counter() - t0, 3)}
