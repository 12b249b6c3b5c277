"""Sync modes under stragglers on this machine (issue 11): the GPT to a target loss under each
straggler trace, in every sync mode the runtime builds (``sync``, ``mask``, ``ksync:3``,
``groups``, ``async``), ``auto`` and ``auto-ml``.
Prints ONE JSON object; progress goes to stderr.

Each run is the product as a user runs it (``unbroken run --trainer gpt --faults none --sync
MODE --stragglers SPEC``: the Supervisor, 4 worker processes of 1 torch thread each, no spare,
the guard log-only), ``--steps`` steps. Traces (``bench/stragglers.py`` says what each is):

* ``none``; ``persistent:1@2`` (one 2x straggler); ``persistent:1@1.5,persistent:2@3`` (two:
  1.5x and 3x); ``bursty:0``; ``rotating:0.3``; ``cpu_hog`` (five busy loops pinned with group
  1 on one core, the other groups on the other: a real cause, no trace).

The loss every mode is judged by is a *data step's*: the mean training loss of its 4 shards,
each on the parameters it is trained on (``unbroken.core.stragglers.data_step_loss_points``);
under ``ksync`` a step's deferred shards are computed later, so its loss counts (and is timed)
at the commit that computes the last of them. A per-step loss is one global batch's and noisy,
so TTA is judged on its running mean over the last ``SMOOTH`` = 10 data steps
(``core.stragglers.running_mean``), and the target loss is where the straggler-free ``sync``
run's smoothed curve is at data step ``--target-step`` (default ``--steps``: where it ends;
the mean of that step's last 10 data steps), plus 1e-9 relative (``mask`` sums the same
gradients in another order). (Before, the target was the lowest single data-step loss of that
run: a lucky batch that a mode with another data order rarely met again.) ``sync``
and ``mask`` compute the synchronous gradient, so they reach it at the same step and TTA
differences are wall-time differences; the bench checks that (``same_losses_in_every_run``,
over every run that spent no step in ksync) -- ``ksync:3`` (and ``auto`` when it chooses
ksync) changes the data order (a deferred shard is used at a later step, on that step's
parameters), so it reaches the target at its own step. Per run: ``tta_train_s`` (from step
0's commit: start-up left out; the TTA compared), ``tta_s`` (from the run's start),
``final_loss`` (the mean loss of the 10 data steps before ``--target-step``: the fixed sample
budget is ``target_step x 4 x shard``), ``final_eval_loss`` (the final parameters' loss on 64
fixed windows between the
training windows, ``GPTTrainer.eval_loss``: it does not depend on when each sample was
trained on, so it is the fair one for modes that defer or delay samples: a deferred shard's
training loss is taken on later, better-trained parameters), ``straggler_frequency``, ``sync_modes``, ``mode_switches``, and what ``auto``'s
predictor saw: ``predicted_ratio`` (per step, the slowest group's predicted per-shard time
over the fastest's -- each group's lowest per-shard compute of the last 5 steps, as
``core.sync.predict_times`` -- median over the steps; a group's steps that contributed nothing
are skipped: before that was fixed, runs with a group left out or deferred read huge ratios).
Repeat i runs seed ``--seed`` + i (another initialisation and data order: the final loss of
this task moves by up to 8 % with the seed alone, so one seed cannot tell a mode's effect from
its data order's luck); each run is judged against its own seed's target, ratios are taken
between runs of one seed and their median over seeds is reported (``reached``: in how many
seeds a mode reached the target). ``ceiling_tta_train_s``: the straggler-free ``sync`` runs'
median.

Bars (issue 11), computed here as met / not met: one persistent straggler: ``auto`` >= 25 %
sooner than ``sync``; no stragglers: ``auto`` within 5 % of ``sync``; every trace: ``auto``
within 10 % of the best static mode in hindsight; final loss within 2 % of ``sync``'s.
``groups`` and ``async`` are static modes here (``auto`` chooses among ``sync``, ``mask`` and
``ksync:K`` only: ``unbroken.runtime.syncmodes`` says why); they change the trajectory (stale
gradients, a lagging data order), so like ``ksync`` they reach the target at their own step.
``async_over_sync`` and ``groups_over_sync`` per trace, and ``where_async_loses``: the traces
where ``async`` is slower to the target than ``sync`` or than the best static mode.

``auto-ml``: ``auto`` with STAR's ML selector choosing the mode (``--sync auto --selector
FILE``), the selector trained at the start of the run as ``unbroken sync train-selector
--runtime --groups 4`` does (2,000 simulated profiles labelled by the runtime's heuristic;
``selector`` reports its held-out agreement). ``pooled`` per trace: TTA on the seeds' mean
curve (:func:`pooled_tta`) against the seeds' mean target, and its ratios: one seed's luck
moves that seed's crossing a lot where the curve is flat (seed 0's ``sync`` ended 0.27 above
seed 1's here), the mean curve less.

Why ``--target-step``: with the target where ``sync``'s curve *ends*, a mode that changes the
data order (``ksync``, ``auto`` when it chooses it) reaches a flat curve's last value within the
run by luck or not at all (a third of the ksync runs at 200 steps: "never"); STAR trains to the
target, so ``--steps 240 --target-step 200`` gives every mode 40 steps of room past it. The
held-out ``final_eval_loss`` is then of the parameters at ``--steps``, past the budget.

Usage: ``.venv/bin/python bench/sync_modes.py [--steps 200] [--target-step S] [--repeats 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stragglers import log, losses, run_case  # noqa: E402

TRACES = ("none", "persistent:1@2", "persistent:1@1.5,persistent:2@3", "bursty:0",
          "rotating:0.3", "cpu_hog")
MODES = ("sync", "mask", "ksync:3", "ksync:2", "groups", "async", "auto", "auto-ml")
STATIC = ("sync", "mask", "ksync:3", "ksync:2", "groups", "async")
#: auto with STAR's ML selector (trained at the start of the run: ``train_selector``)
SELECTOR: dict = {}


def run(trace: str, mode: str, steps: int, seed: int, hogs: int) -> dict:
    if mode == "auto-ml":
        return run_case(trace, steps, seed, hogs, sync="auto", selector=SELECTOR["path"])
    return run_case(trace, steps, seed, hogs, sync=mode)


def train_selector(path: str, seed: int) -> dict:
    """The runtime selector for these 4-group runs (what ``unbroken sync train-selector
    --runtime --groups 4 [--cores C]`` writes, C this machine's cores when the 4 groups
    outnumber them); its held-out comparison with the heuristic."""
    from unbroken.runtime import modelfile
    from unbroken.sync.selector import compare
    from unbroken.sync.selector import train_selector as train

    from unbroken.core.sync import shared_cores

    cores = shared_cores(4, len(os.sched_getaffinity(0)))  # what a run sets
    sel = train(groups=4, n=2000, seed=seed, runtime=True, cores=cores)
    sel.meta["held_out"] = compare(sel, n=300, seed=seed + 1)
    modelfile.save(path, "selector", sel.state, sel.meta)
    return {"path": path, "examples": 2000, "held_out": sel.meta["held_out"]}


def pooled_tta(raws: list[dict], target: float) -> float | None:
    """TTA on the seeds' mean curve: the j-th point of every seed's smoothed curve (time
    order) averaged over seeds; the median over seeds of that point's time from step 0; the
    first j whose mean is at or below ``target`` (the seeds' mean target). One seed's
    trajectory luck moves its own TTA a lot where the curve is flat; the mean curve less."""
    curves = [smoothed(r) for r in raws]
    zero = [min((e["t"] for e in r["events"] if e.get("event") == "commit"
                 and e["step"] == 0), default=None) for r in raws]
    if not curves or None in zero:
        return None
    for j in range(min(len(c) for c in curves)):
        if statistics.fmean(c[j][1] for c in curves) <= target:
            return round(statistics.median(c[j][0] - z for c, z in zip(curves, zero)), 4)
    return None


def predicted_ratio(events: list[dict], window: int = 5) -> float | None:
    """Median over steps of max / min of the groups' predicted per-shard compute (each the
    lowest of its last ``window`` commits' ``compute_s``; 0: computed nothing, skipped)."""
    from unbroken.core.sync import predict_times

    per: dict[int, dict[str, float]] = {}
    for e in events:
        # a group that contributed nothing (left out, deferred) has no per-shard time
        if e.get("event") == "commit" and isinstance(e.get("compute_s"), (int, float)) \
                and e.get("mine"):
            per.setdefault(e["step"], {})[str(e.get("src"))] = float(e["compute_s"])
    groups = sorted({g for v in per.values() for g in v})
    rows = [[per[k].get(g, 0.0) for g in groups] for k in sorted(per)]
    ratios = []
    for i in range(len(rows)):
        p = predict_times(rows[max(0, i - window + 1):i + 1])
        if p is not None and min(p) > 0:
            ratios.append(max(p) / min(p))
    return round(statistics.median(ratios), 3) if ratios else None


#: data steps in the running mean that TTA and the target are judged on
SMOOTH = 10


def smoothed(raw: dict) -> list[tuple[float, float]]:
    """(time, running mean of the last SMOOTH data steps' losses), in time order."""
    from unbroken.core.stragglers import data_step_loss_points, running_mean

    pts = data_step_loss_points([e for e in raw["events"] if e.get("event") == "commit"])
    return running_mean(list(pts.values()), SMOOTH)


def summarise(raw: dict, target: float, budget: int) -> dict:
    from unbroken.core.stragglers import time_to_target
    from unbroken.demo_report import straggler_report

    events, r = raw["events"], raw["report"]
    t0 = next(e["t"] for e in events if e.get("event") == "start")
    sr = straggler_report(events, t0)
    t_step0 = min(e["t"] for e in events if e.get("event") == "commit" and e["step"] == 0)
    curve = smoothed(raw)
    ls = losses(raw)
    return {"tta_train_s": time_to_target(curve, target, t_step0),
            "tta_s": time_to_target(curve, target, t0), "wall_s": r["wall_s"],
            "final_loss": statistics.fmean(ls[budget - 10:budget]),
            "final_eval_loss": raw.get("eval_loss"),
            "straggler_frequency": sr["straggler_frequency"],
            "predicted_ratio": predicted_ratio(events),
            "sync_modes": sr["sync_modes"], "mode_switches": sr["mode_switches"],
            "mean_staleness": _staleness(raw),
            "exactly_once": r.get("exactly_once")}


def _used_ksync(raw: dict) -> bool:
    """The run left the synchronous trajectory (ksync's data order, groups/async's stale
    gradients)."""
    return any(e.get("event") == "commit" and str(e.get("sync", "")).startswith(
        ("ksync", "groups", "async")) for e in raw["events"])


def _staleness(raw: dict) -> float | None:
    """Mean staleness of the shards delivered by the groups' streams (groups/async)."""
    taus = [d[3] for e in raw["events"] if e.get("event") == "commit"
            for d in e.get("delivered", [])]
    return round(statistics.fmean(taus), 3) if taus else None


def _med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 4) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--target-step", type=int, default=None,
                    help="the data step whose straggler-free sync loss is the target and the "
                         "sample budget of final_loss (default: --steps); runs of --steps > "
                         "it leave room to reach the target after a change of data order")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hogs", type=int, default=5)
    ap.add_argument("--traces", default=";".join(TRACES),
                    help="traces separated by ';' (the first must be none: the reference)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="modes separated by ',' (a subset for a quick look; sync and auto "
                         "are needed for the bars)")
    a = ap.parse_args()
    budget = a.target_step or a.steps
    if not 10 <= budget <= a.steps:
        sys.exit(f"sync_modes: --target-step {a.target_step}: choose 10..{a.steps}")
    traces = a.traces.split(";")
    modes = tuple(a.modes.split(","))
    bad = [m for m in modes if m not in MODES]
    if bad or "sync" not in modes or "auto" not in modes:
        sys.exit(f"sync_modes: --modes {a.modes}: choose among {','.join(MODES)}, with sync "
                 f"and auto")
    if "auto-ml" in modes:
        import atexit
        import shutil
        import tempfile

        tmp = tempfile.mkdtemp(prefix="sync_modes_")
        atexit.register(shutil.rmtree, tmp, True)
        SELECTOR.update(train_selector(os.path.join(tmp, "selector.pt"), a.seed))
        log(f"[sync_modes] selector: {SELECTOR['held_out']['agreement']:.1%} agreement with "
            f"the heuristic on held-out profiles")
    raws: dict[str, dict[str, list[dict]]] = {t: {m: [] for m in modes} for t in traces}
    for i in range(a.repeats):  # repeat i runs seed + i: another initialisation and data order
        for t in traces:
            for m in modes:
                log(f"[sync_modes] repeat {i + 1}/{a.repeats} (seed {a.seed + i}): {t} / {m}")
                raws[t][m].append(run(t, m, a.steps, a.seed + i, a.hogs))
    refs = [losses(r) for r in raws["none"]["sync"]]
    # per seed: the smoothed loss its straggler-free sync run ends at (last SMOOTH data steps)
    targets = [smoothed(r)[budget - 1][1] * (1 + 1e-9) for r in raws["none"]["sync"]]
    pooled_target = statistics.fmean(targets)
    same = all(max(abs(x - y) for x, y in zip(losses(r), refs[i])) < 1e-6
               for ms in raws.values() for m, rs in ms.items() for i, r in enumerate(rs)
               if len(losses(r)) == len(refs[i]) and not _used_ksync(r))
    runs = {t: {m: [summarise(r, targets[i], budget) for i, r in enumerate(rs)]
                for m, rs in ms.items()}
            for t, ms in raws.items()}

    def ratio(t: str, m1: str, m2: str, key: str = "tta_train_s") -> float | None:
        """Median over seeds of m1 / m2 (the same seed's runs; both reached the target)."""
        xs = [x[key] / y[key] for x, y in zip(runs[t][m1], runs[t][m2])
              if x[key] is not None and y[key]]
        return round(statistics.median(xs), 3) if xs else None

    summary: dict[str, dict] = {}
    for t, ms in runs.items():
        s = {m: {k: _med([x[k] for x in xs]) for k in
                 ("tta_train_s", "tta_s", "wall_s", "final_loss", "final_eval_loss",
                  "straggler_frequency",
                  "predicted_ratio", "mode_switches", "mean_staleness")} | {
                      "sync_modes": xs[-1]["sync_modes"],
                      "reached": f"{sum(x['tta_train_s'] is not None for x in xs)}/{len(xs)}",
                      "exactly_once": all(x["exactly_once"] for x in xs)}
             for m, xs in ms.items()}
        static = [m for m in STATIC if m in s]
        # the best static mode in hindsight: the lowest median TTA among the modes that
        # reached the target in every seed
        full = [m for m in static if all(x["tta_train_s"] is not None for x in ms[m])] or static
        best = min(full, key=lambda m: s[m]["tta_train_s"] or float("inf"))
        s["best_static"] = best
        s["auto_over_best_static"] = ratio(t, "auto", best)
        s["auto_over_sync"] = ratio(t, "auto", "sync")
        s["final_loss_auto_over_sync"] = ratio(t, "auto", "sync", "final_loss")
        s["final_eval_loss_auto_over_sync"] = ratio(t, "auto", "sync", "final_eval_loss")
        if "auto-ml" in s:
            s["auto-ml_over_sync"] = ratio(t, "auto-ml", "sync")
            s["auto-ml_over_auto"] = ratio(t, "auto-ml", "auto")
            s["auto-ml_over_best_static"] = ratio(t, "auto-ml", best)
            s["final_eval_loss_auto-ml_over_sync"] = ratio(t, "auto-ml", "sync",
                                                           "final_eval_loss")
        # the seeds' mean curve (pooled_tta): less at the mercy of one seed's luck
        pool = {m: pooled_tta(raws[t][m], pooled_target) for m in ms}
        pb = min((m for m in static if pool[m] is not None), key=lambda m: pool[m],
                 default=None)
        s["pooled"] = {"tta_train_s": pool, "best_static": pb, **{
            f"{m}_over_{ref}": round(pool[m] / pool[r], 3)
            if pool.get(m) and pool.get(r) else None
            for m in ("auto", "auto-ml") if m in ms
            for ref, r in (("sync", "sync"), ("best_static", pb)) if r is not None}}
        for m in ("ksync:3", "ksync:2", "groups", "async"):
            if m not in s:
                continue
            s[f"{m}_over_sync"] = ratio(t, m, "sync")
            s[f"final_loss_{m}_over_sync"] = ratio(t, m, "sync", "final_loss")
            s[f"final_eval_loss_{m}_over_sync"] = ratio(t, m, "sync", "final_eval_loss")
        summary[t] = s
    ceiling = summary.get("none", {}).get("sync", {}).get("tta_train_s")
    one = summary.get("persistent:1@2")
    bars = {
        "one_persistent_straggler_auto_25pct_sooner_than_sync": None if one is None else {
            "auto_over_sync": one["auto_over_sync"],
            "met": bool(one["auto_over_sync"] and one["auto_over_sync"] <= 0.75),
            "pooled_auto_over_sync": one["pooled"].get("auto_over_sync"),
            "auto-ml_over_sync": one.get("auto-ml_over_sync")},
        "no_stragglers_auto_within_5pct_of_sync": {
            "auto_over_sync": summary["none"]["auto_over_sync"],
            "met": bool(summary["none"]["auto_over_sync"]
                        and summary["none"]["auto_over_sync"] <= 1.05)},
        "every_trace_auto_within_10pct_of_best_static": {
            t: {"auto_over_best_static": s["auto_over_best_static"], "best": s["best_static"],
                "met": bool(s["auto_over_best_static"] and s["auto_over_best_static"] <= 1.10),
                "pooled_auto_over_best_static": s["pooled"].get("auto_over_best_static"),
                "pooled_best": s["pooled"]["best_static"]}
            for t, s in summary.items()},
        "final_loss_within_2pct_of_sync": {
            t: {"ratio": s["final_loss_auto_over_sync"],
                "met": s["final_loss_auto_over_sync"] is not None
                   and abs(s["final_loss_auto_over_sync"] - 1) <= 0.02}
            for t, s in summary.items()},
        "final_eval_loss_within_2pct_of_sync": {
            t: {"ratio": s["final_eval_loss_auto_over_sync"],
                "met": s["final_eval_loss_auto_over_sync"] is not None
                   and abs(s["final_eval_loss_auto_over_sync"] - 1) <= 0.02}
            for t, s in summary.items()},
    }
    out = {"bench": "sync_modes", "machine": {"cpus": os.cpu_count(),
                                              "python": platform.python_version(),
                                              "loadavg_at_end": os.getloadavg()},
           "steps": a.steps, "target_step": budget, "repeats": a.repeats, "seed": a.seed, "modes": list(modes),
           "where_async_loses": {
               t: {"async_over_sync": s["async_over_sync"], "reached": s["async"]["reached"],
                   "final_eval_loss_over_sync": s["final_eval_loss_async_over_sync"],
                   "best_static": s["best_static"],
                   "async_over_best": round(s["async"]["tta_train_s"]
                                            / s[s["best_static"]]["tta_train_s"], 3)
                   if s["async"]["tta_train_s"] and s[s["best_static"]]["tta_train_s"]
                   else None}
               for t, s in summary.items() if "async" in s
               and (s["async"]["tta_train_s"] is None or s["best_static"] != "async")},
           "target_loss_per_seed": targets, "pooled_target": pooled_target,
           "selector": {k: v for k, v in SELECTOR.items() if k != "path"} or None,
           "smoothing_data_steps": SMOOTH,
           "same_losses_in_every_run": same, "ceiling_tta_train_s": ceiling,
           "bars": bars, "summary": summary, "runs": runs}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
