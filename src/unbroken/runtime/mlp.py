"""The built-in ``"mlp"`` trainer: a 2-layer float64 MLP regression on a seeded synthetic
dataset, SGD with momentum. Small and fast: the runtime's tests train it.

Its hyperparameters are its keyword arguments (``TrainConfig.trainer_args``, ``--trainer-args``),
like any trainer factory's: ``MLPTrainer(cfg, dim=8, hidden=16, lr=0.05, momentum=0.9,
dataset_size=256)``.
"""

from __future__ import annotations

import numpy as np
import torch

from unbroken.core.shards import DataPlan
from unbroken.runtime.config import TrainConfig
from unbroken.runtime.trainer import ParamTrainer, share

__all__ = ["MLPTrainer"]


class MLPTrainer(ParamTrainer):
    """A 2-layer float64 MLP regression on a seeded synthetic dataset, SGD with momentum.

    Every group builds an identical one from the config and the same keyword arguments; the
    gradient of shard type ``t`` at step ``k`` depends only on the parameters and
    (seed, k, t).
    """

    def __init__(self, cfg: TrainConfig, *, dim: int = 8, hidden: int = 16, lr: float = 0.05,
                 momentum: float = 0.9, dataset_size: int = 256) -> None:
        self.cfg, self.hidden = cfg, hidden
        self.data = DataPlan(dataset_size, cfg.groups, cfg.shard_size, cfg.seed)
        rng = np.random.default_rng([cfg.seed, 12345])
        x = rng.standard_normal((dataset_size, dim))
        w = rng.standard_normal(dim)
        y = np.sin(x @ w) + 0.1 * rng.standard_normal(dataset_size)
        self.device = torch.device(cfg.device)
        self.x = torch.from_numpy(x).to(self.device)
        self.y = torch.from_numpy(y)[:, None].to(self.device)
        torch.manual_seed(cfg.seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1),
        ).to(torch.float64).to(self.device)
        self.params = list(self.model.parameters())
        self.numel = sum(p.numel() for p in self.params)
        self.opt = torch.optim.SGD(self.params, lr=lr, momentum=momentum)
        self.last_loss: dict[int, float] = {}

    def loss(self, step: int, shard_type: int, part: tuple[int, int] = (0, 1)) -> torch.Tensor:
        """Mean squared error over part ``part[0]`` of ``part[1]`` equal parts of the shard's
        samples (a rank's share under FSDP; the whole shard by default)."""
        idx = torch.tensor(share(self.data.shard(step, shard_type), part), device=self.device)
        return torch.nn.functional.mse_loss(self.model(self.x[idx]), self.y[idx])

    def grad(self, step: int, shard_type: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._flat_grad(self.loss(step, shard_type), shard_type, out)

    def tp_plan(self) -> dict:
        """Tensor parallelism over the group's ranks: the hidden layer column-wise, the output
        row-wise (Megatron's MLP split); the hidden width must divide evenly."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        from unbroken.runtime.sharding import ShardingError

        ranks = self.cfg.ranks_per_group
        if self.hidden % ranks:
            raise ShardingError(f"--shard tp: hidden width {self.hidden} is not divisible by "
                                f"--ranks-per-group {ranks}")
        return {"0": ColwiseParallel(), "2": RowwiseParallel()}
