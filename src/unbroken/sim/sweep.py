"""Many seeded simulations, spread over the machine's cores, summarised per configuration.

Each run is independent and deterministic given its seed, so a process pool changes the wall
time and nothing else: results are keyed by (strategy, redundancy, seed) and reassembled in
order. Ctrl-C stops the pool at once (its workers are terminated, not drained), and a single
serial run of seeds can be held to a wall-clock budget (``run_budgeted``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import multiprocessing
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from unbroken.core.scenario import Scenario
from unbroken.sim.engine import RunResult, simulate


@dataclass(frozen=True)
class Job:
    strategy: str
    redundancy: int
    seed: int
    ckpt_every: int | None = None


def _run(args: tuple[Scenario, Job]) -> RunResult:
    sc, job = args
    return simulate(sc, job.strategy, job.redundancy, job.seed, job.ckpt_every)


def run_budgeted(sc: Scenario, jobs: list[Job], budget_s: float | None,
                 on_progress: Callable[[int, int], None] | None = None) -> list[RunResult]:
    """Run ``jobs`` one after another within ``budget_s`` seconds of wall time in all.

    Job i may run until start + budget x (i + 1) / len(jobs): an equal share each, and what
    an early finisher leaves over goes to the next. A job that meets its deadline stops with
    ``stopped="budget"`` (its TTT a lower bound). ``on_progress(i, step)`` reports job i's
    step about every 0.2 s.
    """
    start = time.monotonic()
    out = []
    for i, j in enumerate(jobs):
        deadline = None if budget_s is None else start + budget_s * (i + 1) / len(jobs)
        report = None if on_progress is None else (lambda step, i=i: on_progress(i, step))
        out.append(simulate(sc, j.strategy, j.redundancy, j.seed, j.ckpt_every,
                            deadline=deadline, on_progress=report))
    return out


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def run_jobs(sc: Scenario, jobs: Iterable[Job], workers: int | None = None,
             on_done: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Run every job; results come back in job order. ``on_done`` sees each as it finishes."""
    jobs = list(jobs)
    workers = default_workers() if workers is None else workers
    if workers <= 1 or len(jobs) <= 1:
        out = []
        for j in jobs:
            res = _run((sc, j))
            if on_done:
                on_done(res)
            out.append(res)
        return out
    # Longest first keeps both cores busy to the end (SPARe runs cost more than the others).
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].strategy != "spare",
                                                    -jobs[i].redundancy))
    results: dict[int, RunResult] = {}
    # Workers ignore SIGINT: Ctrl-C reaches the whole foreground process group, and only the
    # parent should decide. On any exception (KeyboardInterrupt included) the pool is
    # terminated at once instead of draining the queued simulations.
    pool = multiprocessing.Pool(processes=workers, initializer=_ignore_sigint)
    try:
        pending = {i: pool.apply_async(_run, ((sc, jobs[i]),)) for i in order}
        for i in order:
            results[i] = pending[i].get()
            if on_done:
                on_done(results[i])
    except BaseException:
        _stop(pool)
        raise
    pool.close()
    pool.join()
    return [results[i] for i in range(len(jobs))]


def _stop(pool) -> None:
    """Kill the workers at once and run the pool's own teardown off this thread, for at most
    2 s: ``Pool.terminate`` can block for good on a queue lock a worker holds (an idle one
    waits for a task holding the inqueue's read lock), and a Ctrl-C must not hang the
    command (seen once in the suite: no exit 20 s after SIGINT, never reproduced; with a 5 s
    wait here a blocked teardown made the command take 5.1 s, over its 5 s promise). The
    workers are dead already: what the teardown has left is the pool's own threads."""
    workers = list(getattr(pool, "_pool", []))
    for w in workers:
        try:
            w.kill()
        except Exception:  # gone already
            pass
    t = threading.Thread(target=pool.terminate, daemon=True)
    t.start()
    t.join(timeout=2)
    for w in workers:  # reap them: no zombie left for the caller to find
        w.join(timeout=1)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_MEAN_KEYS = ("ttt_over_t0", "availability", "wipeouts", "masked_failures", "mean_stack_depth")


def summarize(results: list[RunResult]) -> dict:
    """Mean over seeds of the headline metrics, plus their spread and the per-seed records."""
    out: dict = {}
    for k in _MEAN_KEYS:
        vals = np.array([getattr(r, k) for r in results], dtype=float)
        out[k] = float(vals.mean())
    ttt = np.array([r.ttt_over_t0 for r in results])
    out["ttt_over_t0_std"] = float(ttt.std(ddof=1)) if len(ttt) > 1 else 0.0
    out["ttt_over_t0_min"] = float(ttt.min())
    out["ttt_over_t0_max"] = float(ttt.max())
    mus = [r.failures_per_wipeout for r in results if r.failures_per_wipeout is not None]
    out["failures_per_wipeout"] = float(np.mean(mus)) if mus else None
    out["ckpt_every"] = results[0].ckpt_every
    out["per_seed"] = [
        {k: getattr(r, k) for k in ("seed",) + _MEAN_KEYS + ("failures_per_wipeout",)}
        for r in results]
    return out
