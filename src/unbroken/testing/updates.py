"""Code versions a running job can be hot-updated to (``code/<n>`` records, see
``StackedRunner._apply_code``).

A version is a trainer factory (``"package.module:factory"``, the same contract as
``TrainConfig.model``, called with the job's ``trainer_args``): the runner builds it and
carries the training state over at a step boundary, without restarting a process (ByteRobust's
hot update, byterobust.md §7). The chaos run needs an update that is *bad* in the way real
ones are: these factories build the ordinary trainer but its step has a shape bug (a reshape to
the wrong width), so the first step under it raises a real torch error on every group. Only a
rollback to the last good version recovers.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from unbroken.testing.faults import TrainerProxy

__all__ = ["bad_gpt", "bad_mlp"]


class _ShapeBug(TrainerProxy):
    """Wraps a trainer; ``grad`` reshapes the batch to a width one too large first."""

    def grad(self, step: int, shard_type: int, out: torch.Tensor | None = None) -> torch.Tensor:
        p = self.inner.flat_params()
        p.view(-1, p.numel() + 1)  # the bug: raises "shape '[-1, n+1]' is invalid ..."
        return super().grad(step, shard_type, out)


def bad_gpt(cfg, **trainer_args):
    """The built-in GPT (built from ``cfg.trainer_args``, the same as ``trainer_args``)."""
    from unbroken.runtime.trainer import make_trainer

    return _ShapeBug(make_trainer(replace(cfg, model="gpt")))


def bad_mlp(cfg, **trainer_args):
    """The built-in MLP (built from ``cfg.trainer_args``, the same as ``trainer_args``)."""
    from unbroken.runtime.trainer import make_trainer

    return _ShapeBug(make_trainer(replace(cfg, model="mlp")))
