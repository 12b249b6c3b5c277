"""Runtime pieces that run on real processes (torch.distributed, gloo).

Imported lazily so that ``import unbroken.runtime`` does not pull in torch; the planner and the
simulator never need it.

* :mod:`unbroken.runtime.ftcomm` - fault-tolerant all-reduce with generation-numbered groups.
* :mod:`unbroken.runtime.ftcomm_worker` - a probe worker and a local coordinator
  (``LocalCluster``) used by the tests and ``bench/ftcomm_recovery.py``.
* :mod:`unbroken.runtime.stacked` - the stacked data-parallel step: per-type gradients, the
  all-reduce, and on failure re-form + ``core.rectlr.decide`` + patch compute + retry.
* :mod:`unbroken.runtime.stacked_worker` - its worker process and ``StackedCluster``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["FTComm", "RendezvousError", "declare_dead"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("unbroken.runtime.ftcomm"), name)
    raise AttributeError(name)
