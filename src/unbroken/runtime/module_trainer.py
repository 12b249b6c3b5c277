"""An ordinary PyTorch training setup — model, optimizer, dataset, loss — as a ``TrainerLike``.

Why an adapter and not a wrapper around the user's loop: stacked data parallelism needs to
compute the gradient of *any* shard type of *any* step on *any* group (the patch compute after
a failure), and to list the whole training state in a fixed order (snapshots, the state copy
to a joining spare). Both follow from four things a user already has: the model, the
optimizer, an indexable dataset and a loss function. The sample indices of a shard come from
the pure data plan (:class:`unbroken.core.shards.DataPlan`), so the data position is simply the
step number.

Plugging it in: write a factory ``make(cfg, **hyperparameters) -> ModuleTrainer`` in an
importable module and set ``TrainConfig(model="yourpkg.train:make", trainer_args={...})``;
every group and every spare builds the same trainer from the config (seed everything inside
the factory). :func:`unbroken.runtime.trainer.make_trainer` resolves ``"module:function"``
names and calls ``make(cfg, **cfg.trainer_args)``.

Requirements: the gradient must be a deterministic function of the parameters and the batch
(deterministic kernels), the optimizer one whose state can be created eagerly (SGD, Adam,
AdamW: a fresh spare must list the same state tensors as a group that has trained), and the
loss a mean over the shard (the runner sums the N shard-type gradients and divides by N).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.utils.data import default_collate

from unbroken.core.shards import DataPlan
from unbroken.runtime.trainer import ParamTrainer, share

__all__ = ["ModuleTrainer"]

_EAGER = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


class ModuleTrainer(ParamTrainer):
    """``TrainerLike`` over (model, optimizer, dataset, loss_fn).

    ``dataset[i]`` returns one sample (e.g. ``(x, y)``); ``collate`` turns a list of samples
    into a batch (``torch.utils.data.default_collate`` by default); ``forward(model, batch)``
    returns ``(prediction, target)`` for ``loss_fn`` (default: ``batch = (x, y)`` ->
    ``(model(x), y)``).
    """

    def __init__(self, cfg: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 dataset: Sequence, loss_fn: Callable[[Any, Any], torch.Tensor], *,
                 collate: Callable[[list], Any] = default_collate,
                 forward: Callable[[torch.nn.Module, Any], tuple[Any, Any]] | None = None,
                 tp_plan: dict | Callable[[], dict] | None = None) -> None:
        if not isinstance(optimizer, _EAGER):
            raise ValueError(f"optimizer {type(optimizer).__name__}: its state is created "
                             f"lazily; supported: SGD, Adam, AdamW")
        self.cfg = cfg
        self.model = model
        self.opt = optimizer
        self.dataset = dataset
        self.loss_fn = loss_fn
        self.collate = collate
        self.forward = forward or (lambda m, b: (m(b[0]), b[1]))
        # ``--shard tp``: torch's parallelize_module plan for the model (module name ->
        # ColwiseParallel() / RowwiseParallel() ...), or a function returning it
        self.tp_plan = tp_plan
        self.data = DataPlan(len(dataset), cfg.groups, cfg.shard_size, cfg.seed)
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.numel = sum(p.numel() for p in self.params)
        self.device = torch.device(cfg.device)
        self.last_loss: dict[int, float] = {}

    def _to(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._to(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self._to(v) for k, v in batch.items()}
        return batch

    def loss(self, step: int, shard_type: int, part: tuple[int, int] = (0, 1)) -> torch.Tensor:
        """``loss_fn`` over part ``part[0]`` of ``part[1]`` equal parts of the shard's samples
        (a rank's share when the group shards the model with FSDP; the whole shard by
        default)."""
        batch = self._to(self.collate([self.dataset[i] for i in
                                       share(self.data.shard(step, shard_type), part)]))
        pred, target = self.forward(self.model, batch)
        return self.loss_fn(pred, target)

    def grad(self, step: int, shard_type: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._flat_grad(self.loss(step, shard_type), shard_type, out)
