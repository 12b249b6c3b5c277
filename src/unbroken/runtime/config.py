"""The fault-tolerant runtime's configuration (:class:`TrainConfig`): what every worker of a job
shares, serialised as JSON on the worker's command line.

Only what the runtime itself needs lives here: the layout (groups, redundancy), the length of
the run, the seed and the shard size of the data plan (:class:`~unbroken.core.shards.DataPlan`),
the device, the redundant SDC check, and *which* trainer to build
(``model``) with *which* keyword arguments (``trainer_args``). A model's hyperparameters
(width, depth, learning rate, its dataset's size, ...) are its factory's keyword arguments,
for the built-in "mlp" and "gpt" exactly as for a user's ``package.module:factory``
(:func:`unbroken.runtime.trainer.make_trainer`).
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
    # samples per shard type per step (each group's micro-batch): the data plan's unit
    shard_size: int = 8
    # "mlp" (unbroken.runtime.mlp), "gpt" (unbroken.runtime.gpt: a byte-level GPT on stdlib
    # sources), or "package.module:factory" for a user's own trainer (see make_trainer)
    model: str = "mlp"
    # "cpu" (gloo) or "cuda" / "cuda:<i>" (NCCL): configuration, not a code path of its own
    device: str = "cpu"
    # every sdc_every-th step every group also computes the other shard types it hosts and the
    # hosts compare them bit for bit (0: off). Equal to ckpt_every, the checkpoint written
    # after a passing check is a verified roll-back target (see StackedRunner._incident)
    sdc_every: int = 0
    # the trainer factory's keyword arguments (the model's hyperparameters; JSON values):
    # ``factory(cfg, **trainer_args)``, the built-in "mlp" and "gpt" included
    trainer_args: dict = field(default_factory=dict)
    # a straggler trace (``unbroken.core.stragglers``: a pattern, or a CSV file's absolute
    # path): each worker computes its own per-step slowdown from it and the seed. None: none
    stragglers: str | None = None
    # the sync mode (``unbroken.core.sync.parse_mode``; every mode is built:
    # ``unbroken.runtime.syncmodes``). "sync": today's synchronous step
    sync: str = "sync"
    # ``auto``'s chooser: the path of an ML selector model file (``unbroken sync
    # train-selector --runtime``; STAR's ML selector), None: the TTA heuristic
    selector: str | None = None
    # the CPU cores every group's compute shares, when the launcher runs all groups on one
    # machine's CPUs and there are more groups than cores (the sync modes price a mode at the
    # contention it leaves: ``unbroken.core.sync.CostModel.cores``); 0: a device per group
    host_cores: int = 0
    # ranks in one data-parallel group (1: a group is one process); inside a group the model
    # is sharded over its ranks by ``shard``: "fsdp" (torch's FSDP2), "tp" (torch's tensor
    # parallelism, the trainer's tp_plan) or "none" (R = 1 only; unbroken.runtime.sharding)
    ranks_per_group: int = 1
    shard: str = "none"

    @property
    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"

    def local_device(self, uid: int, rank: int, gpus: int) -> str:
        """The device of rank ``rank`` of group ``uid`` on a machine with ``gpus`` GPUs:
        ``"cuda"`` becomes one GPU a process (groups' ranks in order, a spare group's wrapping
        around: NCCL refuses two ranks of one communicator on a GPU, so a machine needs a GPU
        for each process it runs); anything else is kept as given."""
        if self.device != "cuda":
            return self.device
        if gpus < 1:
            raise ValueError("--device cuda: no CUDA device here")
        return f"cuda:{(uid * self.ranks_per_group + rank) % gpus}"

    def to_json(self) -> str:
        d = asdict(self)
        if d["stragglers"] is None:  # a straggler-free config is byte for byte today's (the
            del d["stragglers"]      # reference cache is keyed by it)
        if d["sync"] == "sync":
            del d["sync"]
        if d["selector"] is None:
            del d["selector"]
        if d["host_cores"] == 0:
            del d["host_cores"]
        if d["ranks_per_group"] == 1 and d["shard"] == "none":  # one process a group: today's
            del d["ranks_per_group"], d["shard"]
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> TrainConfig:
        return cls(**json.loads(s))
