"""``unbroken plan --from LEARN.json``: plan with the numbers learn measured.

Why per GPU: learn measures the MTBF of *this* cluster (say 504 GPUs); the plan is for the
cluster being sized (``--gpus``, 600k by default). Failures scale with the number of GPUs, so
the measured MTBF is turned into a per-GPU MTBF (x the GPUs it was measured on) and the
planner divides it by the planned GPU count, exactly as ``--gpu-mtbf`` does. Restart and
checkpoint-save times are taken as measured. A flag given on the command line wins over the
file.
"""

from __future__ import annotations

import argparse
import json
import math

__all__ = ["apply_learned", "read_learn_json"]


def _positive(d: dict, key: str, path: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def read_learn_json(path: str, flag: str):
    """A 'learn --json' result from ``path``; a ValueError naming ``flag`` and the path."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or e}") from None
    except ValueError:
        raise ValueError(f"{flag} {path}: not JSON (expected 'unbroken learn --json' "
                         f"output)") from None


def apply_learned(a: argparse.Namespace, path: str) -> dict:
    d = read_learn_json(path, "--from")
    if not isinstance(d, dict) or "planner" not in d:
        raise ValueError(f"--from {path}: no 'planner' object (expected 'unbroken learn "
                         f"--json' output)")
    p = d["planner"]
    taken = {}
    gpu_mtbf = _positive(p, "gpu_mtbf_s", path)
    if a.mtbf is None and a.gpu_mtbf is None:
        if gpu_mtbf is None:
            raise ValueError(f"--from {path}: no measured MTBF (no failure in the history); "
                             f"give --mtbf or --gpu-mtbf")
        a.gpu_mtbf = gpu_mtbf
        taken["gpu_mtbf_s"] = gpu_mtbf
    for key, attr in (("restart_s", "restart"), ("ckpt_save_s", "ckpt_save")):
        v = _positive(p, key, path)
        if getattr(a, attr) is None and v is not None:
            setattr(a, attr, v)
            taken[key] = v
    taken["measured_on_gpus"] = p.get("gpus")
    taken["intervals_s"] = {k: p.get(k) for k in ("young_s", "daly_s", "saxena_s")}
    return taken
