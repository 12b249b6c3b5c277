"""A model sharded inside its group of ranks: torch's FSDP2 or tensor parallelism, not ours.

Why: a real pretraining job is "model sharded over a few ranks, those shards replicated
data-parallel". unbroken keeps the data-parallel dimension (across groups) fault tolerant --
SPARe's stacked shards, masking, spares -- and leaves the dimension inside a group to torch:
``fully_shard`` (FSDP2) or ``parallelize_module`` (tensor parallelism) on the group's device
mesh. Nothing here shards a tensor by hand.

The mesh is ``(dp_group, shard)`` over torch's default process group, which holds exactly the
group's R ranks. Its ``dp_group`` dimension has size 1 here: the replication across groups is
carried by unbroken's fault-tolerant communicators, one per shard rank (rank k of every group
together, :mod:`unbroken.runtime.ftcomm`), which a failure re-forms without touching the mesh
-- the part of a torch mesh that could not survive losing a group.

:class:`ShardedTrainer` turns a trainer with a ``model``, an ``opt`` and a ``loss(step, t,
part)`` into the :class:`~unbroken.runtime.trainer.TrainerLike` the stacked step needs, on
one rank: ``grad`` is this rank's shard of the group's gradient of shard type ``t`` (FSDP2:
each rank runs 1/R of the shard's samples and the reduce-scatter inside the group averages;
TP: every rank runs the whole shard), flat and float64, which the rank then all-reduces with
rank k of the other groups; ``apply`` steps the optimizer on the local shards.

Exactly the unsharded arithmetic up to the order of float sums: FSDP2's reduce-scatter averages
R sub-batch gradients where a single process sums one batch (tolerance: a few ulps a step).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SHARD_MODES", "ShardingError", "check_sharding", "group_mesh", "ShardedTrainer",
           "rebuilt_optimizer",
           "local"]

#: how a group's ranks share the model: ``none`` (R = 1 only), FSDP2, tensor parallelism
SHARD_MODES = ("none", "fsdp", "tp")


class ShardingError(ValueError):
    """A model that cannot be sharded as asked; the message names the value."""


def check_sharding(inner: Any, how: str, ranks: int) -> Any:
    """Whether ``inner`` (a built trainer) can be sharded ``how`` over ``ranks`` ranks, before
    any process group exists; returns the tensor-parallel plan for ``tp`` (None for fsdp).
    ShardingError (one line naming the value) when it cannot."""
    if how not in ("fsdp", "tp"):
        raise ShardingError(f"--shard {how!r}: expected fsdp or tp")
    plan = None
    if how == "tp":
        plan = getattr(inner, "tp_plan", None)
        if callable(plan):
            plan = plan()
        if not plan:
            model = getattr(inner, "model", inner)
            raise ShardingError(f"--shard tp: model {type(model).__name__} has no tensor "
                                f"parallel plan (give the trainer a tp_plan)")
    for name in ("model", "opt", "loss"):
        if not hasattr(inner, name):
            raise ShardingError(f"--shard {how}: trainer {type(inner).__name__} has no "
                                f"{name!r} (a sharded group needs the model, its optimizer "
                                f"and loss(step, shard_type, part))")
    if how == "fsdp" and inner.cfg.shard_size % ranks:
        raise ShardingError(f"--shard-size {inner.cfg.shard_size} is not divisible by "
                            f"--ranks-per-group {ranks} (fsdp splits each shard of samples "
                            f"evenly over the group's ranks)")
    return plan


def group_mesh(ranks: int, device: str = "cpu") -> Any:
    """The group's device mesh ``(dp_group=1, shard=R)`` over torch's default process group
    (initialised by the worker with the group's R ranks)."""
    from torch.distributed.device_mesh import init_device_mesh

    kind = torch.device(device).type
    return init_device_mesh(kind, (1, ranks), mesh_dim_names=("dp_group", "shard"))


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds of ``t`` (a DTensor's local shard, else ``t``): a view, so an
    in-place write changes ``t``."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def rebuilt_optimizer(opt: torch.optim.Optimizer, old: list[torch.Tensor],
                       new: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The same optimizer class, hyperparameters and parameter groups over the sharded
    parameters (sharding replaces a module's parameters, which the user's optimizer held)."""
    pos = {id(p): i for i, p in enumerate(old)}
    groups = []
    for g in opt.param_groups:
        missing = [p for p in g["params"] if id(p) not in pos]
        if missing:
            raise ShardingError(f"optimizer {type(opt).__name__} holds {len(missing)} tensor(s) "
                                f"that are not parameters of the model: cannot shard it")
        groups.append({**{k: v for k, v in g.items() if k != "params"},
                       "params": [new[pos[id(p)]] for p in g["params"]]})
    # the constructor's own keywords only: ``defaults`` can hold derived ones (AdamW's
    # ``decoupled_weight_decay``); every group carries its settings anyway
    import inspect

    takes = inspect.signature(type(opt).__init__).parameters
    return type(opt)(groups, **{k: v for k, v in opt.defaults.items() if k in takes})


class ShardedTrainer:
    """One rank's share of a trainer whose model is sharded over its group (see module doc).

    ``inner`` must have ``model``, ``opt`` (built over ``model``'s parameters), ``cfg`` and
    ``loss(step, shard_type, part=(k, R)) -> Tensor`` (the mean loss over part k of R of the
    shard's samples); for ``tp``, a ``tp_plan`` (``parallelize_module``'s plan) as well.
    """

    def __init__(self, inner: Any, how: str, mesh: Any) -> None:
        self.inner, self.how, self.cfg = inner, how, inner.cfg
        self.mesh = mesh["shard"]
        self.ranks = self.mesh.size()
        self.rank = self.mesh.get_local_rank()
        model = inner.model
        old = list(model.parameters())
        plan = check_sharding(inner, how, self.ranks)
        if how == "fsdp":
            from torch.distributed.fsdp import fully_shard

            fully_shard(model, mesh=self.mesh)
        else:
            from torch.distributed.tensor.parallel import parallelize_module

            parallelize_module(model, self.mesh, plan)
        self.params = list(model.parameters())
        if len(self.params) != len(old):
            raise ShardingError(f"sharding changed the number of parameters ({len(old)} -> "
                                f"{len(self.params)})")
        self.opt = rebuilt_optimizer(inner.opt, old, self.params)
        inner.opt = self.opt
        self.numel = sum(local(p).numel() for p in self.params)
        self.last_loss: dict[int, float] = {}
        self._grads: tuple[list[torch.Tensor], torch.Tensor | None] | None = None  # apply

    @property
    def model(self) -> torch.nn.Module:
        return self.inner.model

    def grad(self, step: int, shard_type: int, out: torch.Tensor | None = None) -> torch.Tensor:
        part = (self.rank, self.ranks) if self.how == "fsdp" else (0, 1)
        for p in self.params:
            p.grad = None
        loss = self.inner.loss(step, shard_type, part)
        loss.backward()  # FSDP2: reduce-scatter (mean) over the group's ranks
        # this rank's part of the shard (FSDP) or the whole shard (TP): the group's step
        # agreement averages the ranks' losses (runtime.groupsync), no collective of its own
        self.last_loss[shard_type] = float(loss.detach())
        parts = [(torch.zeros_like(local(p)) if p.grad is None else local(p.grad))
                 .reshape(-1).to(torch.float64) for p in self.params]
        for p in self.params:
            p.grad = None
        return torch.cat(parts) if out is None else torch.cat(parts, out=out)

    def apply(self, total: torch.Tensor) -> None:
        """Optimizer step with grad = ``total`` / N, ``total`` this rank's shard of the sum of
        the N shard-type gradients."""
        if self._grads is None:
            self._grads = self._grad_holders()
        holders, flat = self._grads
        if flat is not None:  # every local shard a view of one buffer: one division
            torch.div(total, self.cfg.groups, out=flat)
        else:
            off = 0
            for h in holders:
                lh = local(h)
                n = lh.numel()
                torch.div(total[off:off + n].view_as(lh), self.cfg.groups, out=lh)
                off += n
        for p, h in zip(self.params, holders):
            p.grad = h
        self.opt.step()
        for p in self.params:
            p.grad = None

    def _grad_holders(self) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The gradients ``apply`` hands the optimizer, made once and written in place every
        step: a DTensor built per parameter per step (``DTensor.from_local``) cost more CPU
        than the rest of the step's bookkeeping together (~4 ms a step per rank of the GPT on
        2 cores, ``bench/rank_cpu.py``). (holders, the flat buffer their local shards view,
        or None when the shards' dtypes differ from float64's)."""
        flat = None
        if all(local(p).dtype == torch.float64 for p in self.params):
            flat = torch.empty(self.numel, dtype=torch.float64,
                               device=local(self.params[0]).device)
        holders, off = [], 0
        for p in self.params:
            lp = local(p)
            n = lp.numel()
            lh = flat[off:off + n].view(lp.shape) if flat is not None else torch.empty_like(lp)
            off += n
            if hasattr(p, "_local_tensor"):
                from torch.distributed.tensor import DTensor

                lh = DTensor.from_local(lh, p.device_mesh, p.placements, shape=p.shape,
                                        stride=p.stride(), run_check=False)
            holders.append(lh)
        return holders, flat

    def flat_params(self) -> torch.Tensor:
        """This rank's shards, flat (what it holds and what its plane reduces)."""
        return torch.cat([local(p).detach().reshape(-1).to(torch.float64)
                          for p in self.params])

    def full_params(self) -> torch.Tensor:
        """The whole model's parameters, flat in parameter order (a collective over the
        group: every rank calls it)."""
        return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
                          .reshape(-1).to(torch.float64) for p in self.params])

    def named_state(self) -> dict[str, torch.Tensor]:
        """The state by name, as DTensors (the durable checkpoint: torch DCP writes each
        rank's shards with their place in the whole tensor, so it loads into a group of any
        number of ranks, one included)."""
        from unbroken.runtime.trainer import named_state

        return named_state(self.params, self.opt, self.model)

    def state_tensors(self) -> list[torch.Tensor]:
        """This rank's shards of the parameters, then of each one's optimizer buffers (created
        eagerly, as :func:`~unbroken.runtime.trainer.optimizer_state_tensors` does)."""
        from unbroken.runtime.trainer import optimizer_state_tensors

        return [local(t) for t in optimizer_state_tensors(self.params, self.opt)]
