"""One group's background gradient for ``--sync groups`` / ``async``
(:mod:`unbroken.runtime.syncmodes` decides when; this is the side-effect half).

The trainer's ``grad`` reads the live parameters, and the main thread updates them at every
commit while the job runs, so the job runs on a *shadow*: the innermost trainer deep-copied
once (the model, its optimizer and data plan; a hot update that replaces the trainer makes a
new one), under shallow copies of the live trainer's wrappers (a straggler's slowdown, a
test's sleep: the same machine is slow for its background work too). The training state is
copied into it on the main thread when a job starts, between two commits, and the job reads
only the shadow: no lock is needed, and at most one job per group is in flight.

An abandoned job (a new generation, the run's last step) still runs to its end in its thread;
its result is dropped, and the next job waits for it before it reuses the shadow.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from unbroken.core.sync import Job
from unbroken.runtime.trainer import TrainerLike, copy_state

__all__ = ["Result", "Background"]


@dataclass
class Result:
    """A finished job: the summed gradient of its types, their summed loss, the compute
    seconds per shard, or the training code's exception."""

    job: Job
    grad: torch.Tensor | None
    loss: float
    seconds: float
    error: BaseException | None = None


def _chain(trainer: Any) -> list[Any]:
    """The live trainer's wrappers, outermost first, then the innermost trainer."""
    out = [trainer]
    while "inner" in getattr(out[-1], "__dict__", {}):
        out.append(out[-1].__dict__["inner"])
    return out


class Background:
    """The background job of this group (at most one)."""

    def __init__(self) -> None:
        self._of: Any = None           # the live trainer the shadow was made for
        self._shadow: Any = None       # (outermost wrapper, innermost trainer)
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._result: Result | None = None
        self.job: Job | None = None    # the job whose result counts (None: none or abandoned)

    def _make_shadow(self, trainer: TrainerLike) -> tuple[Any, Any]:
        chain = _chain(trainer)
        inner = copy.deepcopy(chain[-1])
        outer = inner
        for proxy in reversed(chain[:-1]):
            # a wrapper's __getattr__ delegates to ``inner``: no copy.copy (it would recurse)
            p = object.__new__(type(proxy))
            p.__dict__.update(proxy.__dict__)
            p.__dict__["inner"] = outer
            outer = p
        return outer, inner

    def start(self, trainer: TrainerLike, job: Job, types: list[int]) -> None:
        """Snapshot the live training state and compute ``job`` in a thread."""
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()  # an abandoned job still holds the shadow
        if self._of is not trainer:
            self._shadow, self._of = self._make_shadow(trainer), trainer
        outer, inner = self._shadow
        copy_state(inner.state_tensors(), _chain(trainer)[-1].state_tensors())
        self.job, self._result = job, None
        done = self._done = threading.Event()

        def work() -> None:
            t0, acc, loss = time.perf_counter(), None, 0.0
            try:
                for t in types:
                    g = outer.grad(job.data_step, t)
                    acc = g.clone() if acc is None else acc.add_(g)
                    loss += float(outer.last_loss.get(t, float("nan")))
                res = Result(job, acc, loss, (time.perf_counter() - t0) / max(1, len(types)))
            except Exception as exc:  # the training code failed: the step says so in-band
                res = Result(job, None, float("nan"), time.perf_counter() - t0, exc)
            self._result = res
            done.set()

        self._thread = threading.Thread(target=work, name=f"background-{job.data_step}",
                                        daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None) -> Result | None:
        """The result of the current job if it is done within ``timeout`` seconds (None:
        wait for it), else None."""
        if self.job is None:
            return None
        if not self._done.wait(timeout if timeout is None else max(0.0, timeout)):
            return None
        return self._result

    def abandon(self, join: bool = False) -> None:
        """Drop the current job's result (``join``: also wait for its thread to end)."""
        self.job = None
        if join and self._thread is not None:
            self._thread.join()
