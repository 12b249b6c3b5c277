"""The numbers ``plan`` needs, measured from a cluster's history, and the checkpoint intervals
they imply.

Why measure: the planner's defaults (a 5-minute MTBF, a 60-minute restart, a 60-second save)
are guesses about someone else's cluster; the learn face has the real ones. Definitions:

* **MTBF** — observed time over job-interrupting failures (every retry chain is one: an XID, a
  NCCL timeout, anything that stopped the session). Also per GPU (MTBF x GPUs), which is what
  ``unbroken plan --from`` scales to the planned cluster's size.
* **restart** — median time from a failure to training again: the failed attempt's end to the
  recovering attempt's start, plus the median checkpoint *load* (the restart reads the
  checkpoint before it trains).
* **checkpoint save cost** — the median save phase (``core.ckpt_io``).

Intervals (backendai.md §6), with C the save cost, M the MTBF and R the restart:

* Young: sqrt(2 C M);
* Daly: sqrt(2 C M) [1 + sqrt(C / 2M) / 3 + (C / 2M) / 9] - C for C < 2M (``core.theory.daly``
  with no restart term, the reference's form);
* Saxena et al. (arXiv 2410.18124), availability-optimal: C + sqrt(2 (M + R) C + C^2).

Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from unbroken.core import theory

__all__ = ["saxena", "planner_numbers"]


def saxena(t_save: float, mtbf: float, t_restart: float) -> float:
    """Saxena et al.'s availability-optimal interval C + sqrt(2 (M + R) C + C^2)."""
    return t_save + math.sqrt(2.0 * (mtbf + t_restart) * t_save + t_save * t_save)


def _median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.median(xs)) if xs else float("nan")


def planner_numbers(span_s: float, failures: int, recoveries_s: Sequence[float],
                    loads_s: Sequence[float], saves_s: Sequence[float], gpus: int) -> dict:
    """MTBF, restart, save cost and the three intervals; NaN where the history has no data
    (no failure: MTBF is a lower bound, reported as NaN with the reason)."""
    mtbf = span_s / failures if failures else float("nan")
    load = _median(loads_s)
    rec = _median(recoveries_s)
    restart = rec + (load if math.isfinite(load) else 0.0) if math.isfinite(rec) else float("nan")
    save = _median(saves_s)
    out = {"mtbf_s": mtbf, "gpu_mtbf_s": mtbf * gpus if gpus else float("nan"),
           "gpus": gpus, "failures": failures, "span_s": span_s,
           "restart_s": restart, "recovery_wait_s": rec, "ckpt_load_s": load,
           "ckpt_save_s": save}
    ok = all(math.isfinite(x) and x > 0 for x in (mtbf, save))
    out["young_s"] = theory.young(save, mtbf) if ok else float("nan")
    out["daly_s"] = theory.daly(save, mtbf) if ok else float("nan")
    out["saxena_s"] = (saxena(save, mtbf, restart if math.isfinite(restart) else 0.0)
                       if ok else float("nan"))
    out["reason"] = (f"{failures} failures in {span_s / 86400:.1f} days: MTBF "
                     f"{mtbf / 3600:.1f} h; restart {restart / 60:.1f} min; save "
                     f"{save:.0f} s -> checkpoint every {out['young_s'] / 60:.0f} min (Young), "
                     f"{out['daly_s'] / 60:.0f} min (Daly), {out['saxena_s'] / 60:.0f} min "
                     f"(Saxena)") if ok else "not enough history for MTBF and save cost"
    return out
