"""Runtime pieces that run on real processes (torch.distributed, gloo).

Imported lazily so that ``import unbroken.runtime`` does not pull in torch; the planner and the
simulator never need it.

* :mod:`unbroken.runtime.ftcomm` - fault-tolerant all-reduce with generation-numbered groups;
  its parts: :mod:`~unbroken.runtime.ftcomm_ops` (the op and its abandonment),
  :mod:`~unbroken.runtime.ftcomm_rendezvous` (re-form, admission, the process group) and
  :mod:`~unbroken.runtime.ftcomm_heartbeat` (heartbeat thread, abort flag, doorbell).
* :mod:`unbroken.runtime.ftcomm_worker` - a probe worker and a local coordinator
  (``LocalCluster``) used by the tests and ``bench/ftcomm_recovery.py``.
* :mod:`unbroken.runtime.stacked` - the stacked data-parallel step: per-type gradients, the
  all-reduce, and on failure re-form + settle + ``core.rectlr.decide`` + patch compute + retry;
  its parts: :mod:`~unbroken.runtime.stepbuf` (the step buffer's wire format and in-band
  check), :mod:`~unbroken.runtime.incidents` (bad steps and the guard's verdicts) and
  :mod:`~unbroken.runtime.admission` (spares, wipe-outs, the state copy).
* :mod:`unbroken.runtime.stacked_worker` - its worker process (launched by
  :class:`unbroken.supervise.local.StackedCluster`); :mod:`~unbroken.runtime.hooks` - the step's
  hooks and the plug-in a launcher may install (fault injection lives in ``unbroken.testing``).
* :mod:`unbroken.runtime.snapshot` / :mod:`unbroken.runtime.checkpoint` - the checksummed
  state copy sent to a joiner and the durable (DCP) checkpoints.
* :mod:`unbroken.runtime.config` - ``TrainConfig``, the runtime's configuration (no model
  hyperparameters: those are the trainer factory's ``trainer_args``).
* :mod:`unbroken.runtime.trainer` - ``TrainerLike``, ``ParamTrainer``, the trainer registry
  (``make_trainer``) and the single-process ``reference_run``.
* :mod:`unbroken.runtime.mlp`, :mod:`unbroken.runtime.gpt`, :mod:`unbroken.runtime.module_trainer`
  - trainers: the tests' MLP, the demo's byte-level GPT, and an adapter for a user's (model,
  optimizer, dataset, loss).
* :mod:`unbroken.runtime.store_host` - the coordinator's store in a process of its own.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["FTComm", "RendezvousError", "declare_dead"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("unbroken.runtime.ftcomm"), name)
    raise AttributeError(name)
