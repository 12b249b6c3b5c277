"""Sync modes under stragglers: the update gap, the time-to-accuracy model and the selector.

Why choose a mode at all
------------------------
A synchronous step waits for its slowest group. STAR (Zhang & Shen 2025; notes in
shared/reference/star.md) found stragglers common even on identical GPUs and showed that the
usual escape, asynchronous SGD, often reaches a given accuracy *later*: each update carries a
smaller batch, so more updates are needed, and they are stale. Which mode wins depends on two
numbers that change during a run -- the predicted per-group step times and the gradient noise
scale -- so the mode is chosen online by a time-to-accuracy (TTA) model. Everything here is a
decision or a model: pure functions on plain data, no torch, no I/O, no clock; the runtime, the
planner and the simulator call the same ones.

The package, one concern a module (the arrows run down the list):

* :mod:`~unbroken.core.sync.cost` - the modes and the cost model;
* :mod:`~unbroken.core.sync.gap` - each mode's update gap, STAR's released choice of K;
* :mod:`~unbroken.core.sync.tta` - time to accuracy of every mode, the selection;
* :mod:`~unbroken.core.sync.auto` - ``auto``'s online re-choice, the gradient noise scale;
* :mod:`~unbroken.core.sync.measure` - the runtime's measurements as the model's inputs;
* :mod:`~unbroken.core.sync.ksync`, :mod:`~unbroken.core.sync.streams` - the plans of a
  ``ksync`` step and of ``groups``/``async`` streams.
"""

from __future__ import annotations

from unbroken.core.sync.cost import (
    MODES, Mode, parse_mode, CostModel, RUNTIME_MIN_GAIN, RUNTIME_MC_UPDATES,
)
from unbroken.core.sync.gap import (
    ksync_gap, GapEstimate, cluster_times, star_k_scan,
)
from unbroken.core.sync.tta import (
    ModeEstimate, Selection, select, flag_stragglers, tta_of, estimates, ksync_defer_estimate,
)
from unbroken.core.sync.auto import (
    AutoState, AutoDecision, decide, Chooser, noise_scale_terms, NoiseScale,
)
from unbroken.core.sync.measure import (
    AUTO_MODES, RUNTIME_MODES, predict_times, mask_bench, bench_for_mode, uncontended,
    split_times, shared_cores,
)
from unbroken.core.sync.ksync import (
    KsyncStep, ksync_step, drain_step, data_step_losses,
)
from unbroken.core.sync.streams import (
    MAX_STALENESS, Job, AsyncStep, async_units, stream_shard, async_step, restart_after,
)

__all__ = [
    "MODES", "Mode", "parse_mode", "CostModel", "ModeEstimate", "Selection", "ksync_gap",
    "GapEstimate", "cluster_times", "star_k_scan", "select", "flag_stragglers", "tta_of",
    "estimates", "AutoState", "AutoDecision", "decide", "Chooser", "AUTO_MODES",
    "noise_scale_terms", "NoiseScale", "RUNTIME_MODES", "predict_times", "mask_bench",
    "bench_for_mode", "KsyncStep", "ksync_step", "drain_step", "ksync_defer_estimate",
    "uncontended", "split_times", "shared_cores", "data_step_losses", "RUNTIME_MIN_GAIN",
    "RUNTIME_MC_UPDATES", "MAX_STALENESS", "Job", "AsyncStep", "async_units", "stream_shard",
    "async_step", "restart_after",
]
