"""The fault-tolerant runtime's configuration (:class:`TrainConfig`): what every worker of a job
shares, serialised as JSON on the worker's command line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

__all__ = ["TrainConfig"]


@dataclass(frozen=True)
class TrainConfig:
    groups: int = 4
    redundancy: int = 2
    steps: int = 30
    seed: int = 0
    dataset_size: int = 256
    shard_size: int = 8
    dim: int = 8
    hidden: int = 16
    lr: float = 0.05
    momentum: float = 0.9
    # "mlp" (unbroken.runtime.mlp), "gpt" (unbroken.runtime.gpt: a byte-level GPT on stdlib
    # sources), or "package.module:factory" for a user's own trainer (see make_trainer)
    model: str = "mlp"
    seq_len: int = 64
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    # every-step in-memory snapshot of the committed state (off: to measure its cost)
    snapshot: bool = True
    # "cpu" (gloo) or "cuda" / "cuda:<i>" (NCCL): configuration, not a code path of its own
    device: str = "cpu"
    # every sdc_every-th step every group also computes the other shard types it hosts and the
    # hosts compare them bit for bit (0: off). Equal to ckpt_every, the checkpoint written
    # after a passing check is a verified roll-back target (see StackedRunner._incident)
    sdc_every: int = 0
    # keyword arguments for a "package.module:factory" trainer (its model hyperparameters;
    # JSON values): ``factory(cfg, **trainer_args)``
    trainer_args: dict = field(default_factory=dict)

    @property
    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, s: str) -> TrainConfig:
        return cls(**json.loads(s))
