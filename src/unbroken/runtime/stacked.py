"""Stacked data-parallel training step that masks a dead group without a restart.

The step, on each live group (one process per group here)
---------------------------------------------------------
1. Compute the gradient of every shard type the current plan assigns to this group (at first
   ``assignment[t] = t``, depth 1: plain data parallelism), keeping one buffer *per type* for
   the current step, so a later re-plan can re-sum without recomputing.
2. Sum the assigned types into one flat float64 buffer, append an in-band check (one 1.0 per
   contributed type at that type's slot, and the step number), and ``FTComm.allreduce`` it.
3. True: the in-band check must read "every type exactly once, every member at this step";
   then grad = sum / N, optimizer step, one journal line with the contributions (the ledger).
4. False: ``FTComm.reform()`` gives the new members; every survivor calls the pure
   ``rectlr.decide(layout, live, stacks, depth, computed)`` with the same inputs (what each
   group computed this step follows from the previous plan and patches, which every survivor
   knows), so all get the same plan without a coordinator round trip. Each survivor computes
   its ``patch`` types, re-sums exactly its newly assigned types and retries; loop until commit.
   A :class:`~unbroken.core.rectlr.WipeOut` raises :class:`WipeOutError` (restart from the
   snapshot comes next).

The data plan (:mod:`unbroken.core.shards`) is a pure function of (seed, step, type), so any
group can compute any shard; the plan state (stacks, depth, assignment) carries over to the
following steps, so the dead group's types stay with the survivors that took them.

Known limits of this slice
--------------------------
* A group that dies *after* its contribution left (inside the all-reduce) can let some ranks
  commit a step that others retry. That divergence is detected (the in-band step check fails
  on the next all-reduce, :class:`DivergenceError`), not repaired; the repair is a
  roll-forward from a committed peer's reduced gradient.
* A wipe-out is an error; restarts from the in-memory snapshot and spares are next.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch

from unbroken.core.placement import make_layout
from unbroken.core.rectlr import WipeOut, decide, initial_stacks
from unbroken.core.shards import DataPlan

__all__ = ["TrainConfig", "Trainer", "TrainerLike", "make_trainer", "WipeOutError",
           "DivergenceError", "StackedRunner", "reference_run", "ledger_records"]


class WipeOutError(RuntimeError):
    """A shard type lost all of its hosts: the step cannot be masked (restart from snapshot)."""


class DivergenceError(RuntimeError):
    """The in-band check of a completed all-reduce failed (members at different steps, or a
    shard type missing / counted twice)."""


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
    # "mlp" (this file) or "gpt" (unbroken.runtime.gpt: a byte-level GPT on stdlib sources)
    model: str = "mlp"
    seq_len: int = 64
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    # every-step in-memory snapshot of the committed state (off: to measure its cost)
    snapshot: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, s: str) -> TrainConfig:
        return cls(**json.loads(s))


class TrainerLike(Protocol):
    """What the stacked step needs from a model + optimizer (an extension point).

    ``grad(step, t)`` must depend only on the parameters and (seed, step, t), so any group can
    patch-compute any shard type; ``apply(total)`` takes the *sum* of the N shard-type
    gradients. ``state_tensors()`` lists every tensor of the training state (parameters, then
    optimizer buffers) in a fixed order: snapshots and the state copy to a joining spare use it.
    """

    numel: int
    last_loss: dict[int, float]

    def grad(self, step: int, shard_type: int) -> torch.Tensor: ...

    def apply(self, total: torch.Tensor) -> None: ...

    def flat_params(self) -> torch.Tensor: ...

    def state_tensors(self) -> list[torch.Tensor]: ...


def make_trainer(cfg: TrainConfig) -> TrainerLike:
    if cfg.model == "mlp":
        return Trainer(cfg)
    if cfg.model == "gpt":
        from unbroken.runtime.gpt import GPTTrainer

        return GPTTrainer(cfg)
    raise ValueError(f"unknown model {cfg.model!r} (expected 'mlp' or 'gpt')")


class Trainer:
    """A 2-layer float64 MLP regression on a seeded synthetic dataset, SGD with momentum.

    Every group builds an identical one from the config; the gradient of shard type ``t`` at
    step ``k`` depends only on the parameters and (seed, k, t).
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.data = DataPlan(cfg.dataset_size, cfg.groups, cfg.shard_size, cfg.seed)
        rng = np.random.default_rng([cfg.seed, 12345])
        x = rng.standard_normal((cfg.dataset_size, cfg.dim))
        w = rng.standard_normal(cfg.dim)
        y = np.sin(x @ w) + 0.1 * rng.standard_normal(cfg.dataset_size)
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(y)[:, None]
        torch.manual_seed(cfg.seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(cfg.dim, cfg.hidden), torch.nn.Tanh(), torch.nn.Linear(cfg.hidden, 1),
        ).to(torch.float64)
        self.params = list(self.model.parameters())
        self.numel = sum(p.numel() for p in self.params)
        self.opt = torch.optim.SGD(self.params, lr=cfg.lr, momentum=cfg.momentum)
        self.last_loss: dict[int, float] = {}

    def grad(self, step: int, shard_type: int) -> torch.Tensor:
        idx = torch.tensor(self.data.shard(step, shard_type))
        loss = torch.nn.functional.mse_loss(self.model(self.x[idx]), self.y[idx])
        self.last_loss[shard_type] = float(loss.detach())
        gs = torch.autograd.grad(loss, self.params)
        return torch.cat([g.reshape(-1) for g in gs])

    def apply(self, total: torch.Tensor) -> None:
        """Optimizer step with grad = ``total`` / N (the sum of the N shard-type gradients)."""
        g = total / self.cfg.groups
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad = g[off:off + n].view_as(p).clone()
            off += n
        self.opt.step()

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def state_tensors(self) -> list[torch.Tensor]:
        return optimizer_state_tensors(self.params, self.opt)


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
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
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
        total = torch.zeros(tr.numel, dtype=torch.float64)
        for t in range(cfg.groups):
            total += tr.grad(k, t)
        tr.apply(total)
    return tr.flat_params()


class StackedRunner:
    """Runs ``cfg.steps`` stacked data-parallel steps on one group over an ``FTComm``.

    ``journal(obj)`` receives one dict per event: ``{"event": "commit", "step", "gen",
    "members", "mine", "plan", "t"}`` per committed step (``mine``: the shard types whose
    gradients this group put into the sum; ``plan``: type -> contributing group) and
    ``{"event": "replan", ...}`` per masked failure.
    """

    def __init__(self, cfg: TrainConfig, uid: int, comm: Any,
                 journal: Callable[[dict], None] = lambda e: None,
                 die_at: int | None = None, on_die: Callable[[], None] | None = None) -> None:
        self.cfg = cfg
        self.uid = uid
        self.comm = comm
        self.journal = journal
        self.die_at = die_at
        self.on_die = on_die
        self.layout = make_layout(cfg.groups, cfg.redundancy)
        self.trainer = make_trainer(cfg)
        self.stacks = initial_stacks(self.layout)
        self.depth = 1
        self.contrib: dict[int, tuple[int, ...]] = {w: (w,) for w in range(cfg.groups)}
        self.step = 0

    def run(self) -> torch.Tensor:
        while self.step < self.cfg.steps:
            self.run_step()
        return self.trainer.flat_params()

    def run_step(self) -> None:
        k, n, tr = self.step, self.cfg.groups, self.trainer
        grads = {t: tr.grad(k, t) for t in self.contrib.get(self.uid, ())}
        # what every live group has computed this step: a function of the plans, known to all
        computed = {w: set(ts) for w, ts in self.contrib.items()}
        if self.die_at == k:
            if self.on_die is not None:
                self.on_die()
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            mine = self.contrib.get(self.uid, ())
            buf = torch.zeros(tr.numel + n + 2, dtype=torch.float64)
            for t in mine:
                buf[:tr.numel] += grads[t]
                buf[tr.numel + t] += 1.0
                buf[-2] += tr.last_loss.get(t, float("nan"))
            buf[-1] = float(k)
            if self.comm.allreduce(buf):
                break
            t0 = time.time()
            members = self.comm.reform()
            d = decide(self.layout, members, self.stacks, self.depth,
                       computed={w: sorted(computed.get(w, ())) for w in members})
            if isinstance(d, WipeOut):
                self.journal({"event": "wipeout", "step": k, "members": members,
                              "lost_types": list(d.lost_types), "reason": d.reason,
                              "t": time.time()})
                raise WipeOutError(f"step {k}: {d.reason}; masking is impossible, restart "
                                   f"from the snapshot (not implemented yet)")
            self.stacks, self.depth, self.contrib = d.stacks, d.depth, d.contributions()
            for w, ts in d.patch.items():
                computed.setdefault(w, set()).update(ts)
            for t in d.patch.get(self.uid, ()):
                grads[t] = tr.grad(k, t)
            missing = set(self.contrib.get(self.uid, ())) - set(grads)
            assert not missing, f"plan assigns types {missing} that were never computed"
            self.journal({"event": "replan", "step": k, "gen": self.comm.generation,
                          "members": members, "phase": d.phase, "depth": d.depth,
                          "patch": {str(w): list(ts) for w, ts in d.patch.items()},
                          "reason": d.reason, "reform_at": t0, "t": time.time()})
        members = self.comm.members
        cover = buf[tr.numel:tr.numel + n]
        if float(buf[-1]) != k * len(members):
            raise DivergenceError(
                f"step {k}: members are at different steps (step sum {float(buf[-1])}, "
                f"expected {k} x {len(members)}): a step was committed by only some members")
        if not bool((cover == 1.0).all()):
            raise DivergenceError(
                f"step {k}: shard-type coverage {cover.tolist()} is not all ones: a type is "
                f"missing from or counted twice in the sum")
        tr.apply(buf[:tr.numel])
        self.journal({"event": "commit", "step": k, "gen": self.comm.generation,
                      "members": members, "mine": list(mine),
                      "plan": {str(t): w for w, ts in self.contrib.items() for t in ts},
                      "loss": float(buf[-2]) / n, "t": time.time()})
        self.step += 1


def ledger_records(journals: dict[int, list[dict]]) -> list[tuple[int, int, int]]:
    """(step, type, group) contributions from every group's journal (dead groups included).

    Each group journals only what it put into a committed sum itself. Raises
    :class:`DivergenceError` when two groups journaled different plans for the same step.
    """
    recs: list[tuple[int, int, int]] = []
    plans: dict[int, dict] = {}
    for g, events in journals.items():
        for e in events:
            if e.get("event") != "commit":
                continue
            if plans.setdefault(e["step"], e["plan"]) != e["plan"]:
                raise DivergenceError(f"step {e['step']}: groups committed different plans")
            recs.extend((e["step"], t, g) for t in e["mine"])
    return recs
