"""STAR's straggler predictor: an LSTM from the last 30 steps' resources to the next 30 steps.

Why this shape
--------------
STAR predicts stragglers from resource traces because the cause of a straggler on identical
GPUs is CPU and network contention, which shows in the resources before (and while) it shows in
the step time. Its released code chains two models (an LSTM forecasting CPU and bandwidth, then
an MLP mapping them to a step time) and forecasts 30 steps autoregressively. Here one network
does both: a 2-layer LSTM, hidden size 50, over a window of 30 per-step samples (CPU
availability, bytes sent, bytes received and the step time itself), and a **direct 30-output
linear head** on the last hidden state -- all 30 future steps at once, so errors do not compound
through fed-back predictions and one forward pass serves a decision.

Inputs are made scale-free per window, so one model serves any model size and step time:
step times are divided by the window's median step time of that group (the outputs are in the
same unit and multiplied back), bytes by the window's mean bytes, CPU availability is a share
already. A persistent straggler's window is all slow, so its reference is slow too and the
prediction stays slow.

A straggler is a group predicted more than 20 % slower than the fastest group at the same
future step (STAR). :func:`evaluate` scores any predictor -- this one, or :func:`last_value`,
the baseline that repeats the last observed step time -- by the MAE of the step time and the
precision and recall of that flag over every (window, future step, group).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from unbroken.sync.journal import FEATURES

__all__ = ["WINDOW", "HORIZON", "HIDDEN", "LAYERS", "Predictor", "last_value", "windows",
           "train_predictor", "evaluate"]

WINDOW, HORIZON, HIDDEN, LAYERS = 30, 30, 50, 2
_STEP = FEATURES.index("step_s")
_BYTES = [FEATURES.index("tx_bytes"), FEATURES.index("rx_bytes")]


def _normalise(win: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(M, W, F) raw windows -> (scale-free inputs, (M,) step-time reference)."""
    x = np.array(win, dtype=np.float32, copy=True)
    ref = np.median(x[:, :, _STEP], axis=1)
    ref = np.where(ref > 0, ref, 1.0)
    x[:, :, _STEP] /= ref[:, None]
    for j in _BYTES:
        scale = x[:, :, j].mean(axis=1)
        x[:, :, j] /= np.where(scale > 0, scale, 1.0)[:, None]
    return x, ref.astype(np.float32)


def windows(run: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """All (window, next HORIZON step times) pairs of one run (groups, steps, FEATURES): raw
    windows (M, WINDOW, F) and raw targets (M, HORIZON), group-major."""
    g, s, _ = run.shape
    ends = range(WINDOW, s - HORIZON + 1, stride)
    if not len(ends):
        return np.zeros((0, WINDOW, len(FEATURES))), np.zeros((0, HORIZON))
    xs = np.stack([run[:, e - WINDOW:e] for e in ends], axis=1)        # (G, E, W, F)
    ys = np.stack([run[:, e:e + HORIZON, _STEP] for e in ends], axis=1)  # (G, E, H)
    return xs.reshape(-1, WINDOW, run.shape[2]), ys.reshape(-1, HORIZON)


def last_value(win: np.ndarray) -> np.ndarray:
    """The baseline: every future step takes the last observed step time. (G, W, F) -> (G, H)."""
    return np.repeat(np.asarray(win)[:, -1, _STEP][:, None], HORIZON, axis=1)


def _net():
    import torch
    from torch import nn

    class StepLSTM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(len(FEATURES), HIDDEN, LAYERS, batch_first=True)
            self.head = nn.Linear(HIDDEN, HORIZON)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(x)
            return 1.0 + self.head(out[:, -1])  # a residual around "as the median so far"

    return StepLSTM()


@dataclass
class Predictor:
    """A trained predictor. ``predict(win)``: (G, WINDOW, FEATURES) raw per-group windows (the
    reader's columns, ``journal.FEATURES``) -> (G, HORIZON) predicted step seconds."""

    state: dict
    meta: dict = field(default_factory=dict)
    _model: object = field(default=None, repr=False, compare=False)

    def model(self):
        if self._model is None:
            m = _net()
            m.load_state_dict(self.state)
            m.eval()
            self._model = m
        return self._model

    def predict(self, win: np.ndarray) -> np.ndarray:
        import torch

        win = np.asarray(win, dtype=np.float32)
        if win.ndim != 3 or win.shape[1:] != (WINDOW, len(FEATURES)):
            raise ValueError(f"expected windows of shape (groups, {WINDOW}, {len(FEATURES)}), "
                             f"got {win.shape}")
        x, ref = _normalise(win)
        with torch.no_grad():
            y = self.model()(torch.from_numpy(x)).numpy()
        return np.maximum(y, 1e-3) * ref[:, None]


def train_predictor(runs: Sequence[np.ndarray], seed: int = 0, epochs: int = 12,
                    stride: int = 2, batch: int = 128, lr: float = 3e-3,
                    budget_s: float | None = None) -> Predictor:
    """Train on every window of ``runs`` (each (groups, steps, FEATURES)), seeded. L1 loss on
    the scale-free step times (the metric is an absolute error); Adam; ``budget_s`` stops early
    at an epoch boundary."""
    import torch

    pairs = [windows(r, stride) for r in runs]
    raw_x = np.concatenate([p[0] for p in pairs]) if pairs else np.zeros((0,))
    if raw_x.shape[0] == 0:
        raise ValueError(f"no training window: every run needs at least {WINDOW + HORIZON} "
                         f"steps on all its groups")
    raw_y = np.concatenate([p[1] for p in pairs])
    x, ref = _normalise(raw_x)
    y = (raw_y / ref[:, None]).astype(np.float32)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    t0, losses = time.perf_counter(), []
    for _ in range(epochs):
        perm = torch.randperm(xt.shape[0], generator=gen)
        total = 0.0
        for i in range(0, xt.shape[0], batch):
            idx = perm[i:i + batch]
            loss = torch.nn.functional.l1_loss(net(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * idx.numel()
        losses.append(total / xt.shape[0])
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            break
    net.eval()
    meta = {"kind": "predictor", "window": WINDOW, "horizon": HORIZON, "hidden": HIDDEN,
            "layers": LAYERS, "features": list(FEATURES), "head": "direct",
            "windows": int(xt.shape[0]), "epochs": len(losses), "seed": seed,
            "train_l1": losses[-1], "train_s": round(time.perf_counter() - t0, 3)}
    return Predictor({k: v.detach().clone() for k, v in net.state_dict().items()}, meta, net)


def _flags(t: np.ndarray, ratio: float) -> np.ndarray:
    """(G, H) step times -> (G, H) straggler flags: over ``ratio`` x the fastest at that step."""
    return t > ratio * t.min(axis=0, keepdims=True)


def evaluate(predict: Callable[[np.ndarray], np.ndarray], runs: Sequence[np.ndarray],
             stride: int = 5, ratio: float = 1.2) -> dict:
    """Score ``predict`` ((G, W, F) -> (G, H)) on every window end of ``runs``: ``mae_s`` (mean
    absolute error of the step time, seconds), ``rel_mae`` (the same over the true time), and
    ``precision`` / ``recall`` of the straggler flag (None when nothing was flagged)."""
    abs_err, rel_err, tp, fp, fn, n = 0.0, 0.0, 0, 0, 0, 0
    for run in runs:
        g, s, _ = run.shape
        for e in range(WINDOW, s - HORIZON + 1, stride):
            truth = run[:, e:e + HORIZON, _STEP]
            pred = np.asarray(predict(run[:, e - WINDOW:e]))
            abs_err += float(np.abs(pred - truth).sum())
            rel_err += float((np.abs(pred - truth) / truth).sum())
            n += truth.size
            if g > 1:
                pf, tf = _flags(pred, ratio), _flags(truth, ratio)
                tp += int(np.sum(pf & tf))
                fp += int(np.sum(pf & ~tf))
                fn += int(np.sum(~pf & tf))
    if n == 0:
        raise ValueError(f"no evaluation window: runs need at least {WINDOW + HORIZON} steps")
    return {"mae_s": abs_err / n, "rel_mae": rel_err / n, "points": n,
            "precision": tp / (tp + fp) if tp + fp else None,
            "recall": tp / (tp + fn) if tp + fn else None,
            "stragglers": tp + fn}
