"""What the stacked step needs from a model + optimizer, and how a trainer is named and built.

* :class:`TrainerLike` - the protocol (the extension point).
* :class:`ParamTrainer` - the part every built-in trainer and
  :class:`~unbroken.runtime.module_trainer.ModuleTrainer` share (flat gradient, optimizer step
  from the summed gradient, the state listing).
* :func:`make_trainer` - the registry: ``cfg.model`` names a factory, called as
  ``factory(cfg, **cfg.trainer_args)`` in every group and spare; the built-in "mlp"
  (:mod:`unbroken.runtime.mlp`) and "gpt" (:mod:`unbroken.runtime.gpt`) the same way as a
  user's ``"package.module:factory"``.
* :func:`reference_run` - the failure-free single-process run every runtime test compares with.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import torch

from unbroken.runtime.config import TrainConfig

__all__ = ["TrainerLike", "ParamTrainer", "BUILTIN", "make_trainer", "grad_into", "copy_state",
           "apply_sum", "flat", "optimizer_state_tensors", "named_state", "reference_run", "share"]

#: the built-in trainers' factories (``"package.module:factory"``, imported on first use)
BUILTIN = {"mlp": "unbroken.runtime.mlp:MLPTrainer", "gpt": "unbroken.runtime.gpt:GPTTrainer"}


class TrainerLike(Protocol):
    """What the stacked step needs from a model + optimizer (an extension point).

    ``grad(step, t)`` must depend only on the parameters and (seed, step, t), so any group can
    patch-compute any shard type; ``apply(total)`` takes the *sum* of the N shard-type
    gradients. ``state_tensors()`` lists every tensor of the training state (parameters, then
    optimizer buffers) in a fixed order: snapshots and the state copy to a joining spare use it.

    ``grad`` may take ``out=`` (a flat float64 tensor of ``numel``) and write the gradient
    there: the runner then computes a group's own shard straight into the step's all-reduce
    buffer, as plain data parallelism reduces the gradient it computed, with no copy. A grad
    without ``out`` works too (its result is copied into the buffer).
    """

    numel: int
    last_loss: dict[int, float]

    def grad(self, step: int, shard_type: int) -> torch.Tensor: ...

    def apply(self, total: torch.Tensor) -> None: ...

    def flat_params(self) -> torch.Tensor: ...

    def state_tensors(self) -> list[torch.Tensor]: ...


def make_trainer(cfg: TrainConfig) -> TrainerLike:
    """The trainer named by ``cfg.model``: "mlp", "gpt", or "package.module:factory" (a
    function of the config, e.g. one returning a
    :class:`~unbroken.runtime.module_trainer.ModuleTrainer`: how a user's own model, optimizer
    and dataset come in), called as ``factory(cfg, **cfg.trainer_args)``; every group and
    spare builds it the same way. An unknown keyword argument is the factory's ``TypeError``."""
    name = BUILTIN.get(cfg.model, cfg.model)
    if ":" not in name:
        raise ValueError(f"unknown model {cfg.model!r} (expected 'mlp', 'gpt' or "
                         f"'package.module:factory')")
    mod, _, fn = name.partition(":")
    return getattr(importlib.import_module(mod), fn)(cfg, **cfg.trainer_args)


_TAKES_OUT: dict[type, bool] = {}


def grad_into(trainer: TrainerLike, step: int, shard_type: int,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """``trainer.grad(step, shard_type)``, in ``out`` when given: written there by the trainer
    itself when its ``grad`` takes ``out``, else copied. Returns ``out`` (or the gradient)."""
    if out is None:
        return trainer.grad(step, shard_type)
    cls = type(trainer)
    if cls not in _TAKES_OUT:
        import inspect

        _TAKES_OUT[cls] = "out" in inspect.signature(trainer.grad).parameters
    g = (trainer.grad(step, shard_type, out=out) if _TAKES_OUT[cls]
         else trainer.grad(step, shard_type))
    if g.data_ptr() != out.data_ptr():
        out.copy_(g)
    return out


def share(indices: list[int], part: tuple[int, int]) -> list[int]:
    """Part ``k`` of ``n`` equal, contiguous parts of a shard's sample indices (``part`` =
    (k, n)): a rank's share of the shard when its group shards the model with FSDP."""
    k, n = part
    size = len(indices) // n
    return list(indices[k * size:(k + 1) * size])


def copy_state(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """Copy a training state (``state_tensors()`` order) into another trainer's tensors."""
    with torch.no_grad():
        for d, s in zip(dst, src):
            d.copy_(s)


class ParamTrainer:
    """The part every trainer shares: ``params``, ``opt``, ``cfg`` and ``last_loss`` set by the
    subclass; the shard gradient as one flat float64 vector, the optimizer step from the sum
    of the N shard gradients, and the state listing."""

    params: list[torch.Tensor]
    opt: torch.optim.Optimizer
    last_loss: dict[int, float]

    def _flat_grad(self, loss: torch.Tensor, shard_type: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        self.last_loss[shard_type] = float(loss.detach())
        gs = torch.autograd.grad(loss, self.params, allow_unused=True)
        parts = [(torch.zeros_like(p) if g is None else g).reshape(-1).to(torch.float64)
                 for p, g in zip(self.params, gs)]
        return torch.cat(parts) if out is None else torch.cat(parts, out=out)

    def apply(self, total: torch.Tensor) -> None:
        """Optimizer step with grad = ``total`` / N (the sum of the N shard-type gradients)."""
        apply_sum(self.params, self.opt, total, self.cfg.groups)

    def flat_params(self) -> torch.Tensor:
        return flat(self.params)

    def state_tensors(self) -> list[torch.Tensor]:
        return optimizer_state_tensors(self.params, self.opt)

    def named_state(self) -> dict[str, torch.Tensor]:
        """The state by name (the durable checkpoint's keys): a checkpoint written by a group
        of any number of ranks loads into any other (``runtime.sharding``)."""
        return named_state(self.params, self.opt, getattr(self, "model", None))


def named_state(params: list[torch.Tensor], opt: torch.optim.Optimizer,
                model: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
    """``model.<name>`` for each parameter (its name in ``model``; ``p<i>`` without one), then
    ``optim.<name>.<buffer>`` for its optimizer buffers (created eagerly, as
    :func:`optimizer_state_tensors` does). The names do not depend on how the parameters are
    sharded: FSDP2 and tensor parallelism keep a module's parameter names."""
    optimizer_state_tensors(params, opt)
    names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    out: dict[str, torch.Tensor] = {}
    keyed = [(names.get(id(p), f"p{i}"), p) for i, p in enumerate(params)]
    for n, p in keyed:
        out[f"model.{n}"] = p
    for n, p in keyed:
        for buf, v in sorted(opt.state[p].items()):
            if isinstance(v, torch.Tensor):
                out[f"optim.{n}.{buf}"] = v
    return out


def apply_sum(params: list[torch.Tensor], opt: torch.optim.Optimizer, total: torch.Tensor,
              groups: int) -> None:
    """Optimizer step with grad = ``total`` / N (``total``: the sum of the N shard-type
    gradients, flat, in parameter order)."""
    g = total / groups
    off = 0
    for p in params:
        n = p.numel()
        p.grad = g[off:off + n].view_as(p).to(p.dtype).clone()
        off += n
    opt.step()


def flat(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float64) for p in params])


def optimizer_state_tensors(params: list[torch.Tensor], opt: torch.optim.Optimizer
                            ) -> list[torch.Tensor]:
    """Parameters, then each parameter's optimizer buffers sorted by name. The buffers are
    created eagerly (zeros: the same first update as lazily created ones) so that a fresh
    process lists the same tensors as one that has trained."""
    out = [p.data for p in params]
    for p in params:
        st = opt.state[p]
        if not st:
            if isinstance(opt, torch.optim.SGD):
                st["momentum_buffer"] = torch.zeros_like(p)
            elif isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
                st["step"] = torch.tensor(0.0, dtype=torch.float32)  # AdamW keeps it on CPU
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        for name in sorted(st):
            v = st[name]
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out


def reference_run(cfg: TrainConfig) -> torch.Tensor:
    """Single process: per step, sum the N shard-type gradients, divide by N, step."""
    tr = make_trainer(cfg)
    for k in range(cfg.steps):
        total = torch.zeros(tr.numel, dtype=torch.float64, device=cfg.device)
        for t in range(cfg.groups):
            total += tr.grad(k, t)
        tr.apply(total)
    return tr.flat_params()
