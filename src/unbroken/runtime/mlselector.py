"""STAR's ML mode selector as the runtime decides with it: the network, its input and its file.

``unbroken run --sync auto --selector FILE`` makes every worker load the file and let the
network choose the mode (:meth:`MLSelector.chooser`, ``core.sync.decide``'s ``choose``) instead
of the cost model's heuristic. Training the network and comparing it with the heuristic is the
sync face's offline work (:mod:`unbroken.sync.selector`); what runs inside a worker is here, so
the runtime imports nothing from the sync face. Torch is imported when a network is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from unbroken.core.sync import CostModel, Selection, estimates

__all__ = ["classes_for", "features", "selector_net", "MLSelector", "load_selector"]


def classes_for(groups: int) -> list[str]:
    return ["sync", "mask", "groups", "async"] + [f"ksync:{k}" for k in range(1, groups)]


def features(times: np.ndarray, phi: float, shard_batch: int) -> np.ndarray:
    """The selector's input for one decision: sorted times / fastest, log(1 + phi/B), N."""
    t = np.sort(np.asarray(times, dtype=float))
    return np.concatenate([t / t[0], [math.log1p(phi / shard_batch), float(t.size)]])


def selector_net(n_in: int, n_out: int):
    from torch import nn

    return nn.Sequential(nn.Linear(n_in, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, n_out))


@dataclass
class MLSelector:
    """A trained selector. ``choose(times, phi)`` -> (mode, reason)."""

    state: dict
    meta: dict
    _model: object = field(default=None, repr=False, compare=False)

    def model(self):
        if self._model is None:
            m = selector_net(self.meta["groups"] + 2, len(self.meta["classes"]))
            m.load_state_dict(self.state)
            m.eval()
            self._model = m
        return self._model

    def choose(self, times, phi: float,
               allowed: tuple[str, ...] | None = None) -> tuple[str, str]:
        """The most likely mode among ``allowed`` (mode names; ``ksync`` allows every K;
        default: every class), and a one-line reason."""
        import torch

        t = np.asarray(times, dtype=float)
        if t.shape != (self.meta["groups"],):
            raise ValueError(f"this selector was trained for {self.meta['groups']} groups, got "
                             f"{t.size} step times")
        x = (features(t, phi, self.meta["shard_batch"]) - self.meta["mean"]) / self.meta["std"]
        with torch.no_grad():
            p = torch.softmax(self.model()(torch.tensor(x, dtype=torch.float32)[None]), -1)[0]
        classes = self.meta["classes"]
        # sync is always allowed, as the heuristic's select() always allows it
        ok = [i for i, c in enumerate(classes)
              if allowed is None or c == "sync" or c.split(":")[0] in allowed]
        i = max(ok, key=lambda j: float(p[j]))
        mode = classes[i]
        return mode, f"{mode}: ML selector ({float(p[i]):.0%} confident)"

    def chooser(self):
        """``core.sync.decide``'s ``choose``: this network picks the mode; every mode is
        still estimated by the cost model for the journal's ``predicted``."""
        def choose(times, cm: CostModel, flagged, allowed, greedy_mask: bool) -> Selection:
            mode, why = self.choose(times, cm.noise_scale, tuple(allowed))
            est = estimates(times, cm, flagged, greedy_mask)
            listing = ", ".join(f"{e.mode} {e.tta:.4g}" for e in est.values())
            return Selection(mode, est, f"{why}; predicted s/step: {listing}")
        return choose


def load_selector(path: str) -> MLSelector:
    """The ML selector saved in ``path``; ModelFileError (a ValueError) naming the file."""
    from unbroken.runtime.modelfile import load_model

    return load_model(path, "selector", MLSelector)
