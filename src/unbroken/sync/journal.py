"""Per-group step sequences for the predictor, read from run journals.

A run writes ``DIR/group-U.jsonl``, one JSON object per line (``runtime.stacked_worker``); a
committed step is ``{"event": "commit", "step": k, "compute_s": ..., "t": ...}``. The predictor
wants, per group, a sequence of dicts with the keys ``step``, ``step_s``, ``cpu_avail``,
``tx_bytes`` and ``rx_bytes`` (:data:`KEYS`). The per-step resource fields are being added to
the commit line by the runtime; their final names are settled at merge, and
:func:`record_of` is the one function to adapt then. Missing resource keys read as 0.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable, Mapping

import numpy as np

__all__ = ["KEYS", "FEATURES", "record_of", "read_journal_dir", "read_journals", "to_array"]

KEYS = ("step", "step_s", "cpu_avail", "tx_bytes", "rx_bytes")
#: the per-step input features of the predictor, in column order
FEATURES = ("cpu_avail", "tx_bytes", "rx_bytes", "step_s")
_GROUP_FILE = re.compile(r"^group-(\d+)\.jsonl$")


def record_of(ev: Mapping, prev_t: float | None) -> dict | None:
    """One journal event -> one step record, or None for an event that is not a commit.

    The step time is ``step_s`` when the line carries it, else the time since this group's
    previous commit (``t`` - ``prev_t``), else ``compute_s``. Adapt here at merge."""
    if ev.get("event") != "commit" or "step" not in ev:
        return None
    if "step_s" in ev:
        step_s = float(ev["step_s"])
    elif prev_t is not None and "t" in ev:
        step_s = float(ev["t"]) - prev_t
    elif "compute_s" in ev:
        step_s = float(ev["compute_s"])
    else:
        return None
    return {"step": int(ev["step"]), "step_s": step_s,
            "cpu_avail": float(ev.get("cpu_avail", 0.0) or 0.0),
            "tx_bytes": float(ev.get("tx_bytes", 0.0) or 0.0),
            "rx_bytes": float(ev.get("rx_bytes", 0.0) or 0.0)}


def _read_file(path: str) -> list[dict]:
    out, prev_t, seen = [], None, set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                # a SIGKILLed group can leave a torn last line; anything else is a bad file
                if f.readline() == "":
                    break
                raise ValueError(f"{path} line {n}: not JSON") from None
            rec = record_of(ev, prev_t)
            if ev.get("event") == "commit" and "t" in ev:
                prev_t = float(ev["t"])
            if rec is None or rec["step"] in seen or not rec["step_s"] > 0:
                continue  # a redone step after a restart counts once; the first has no gap
            seen.add(rec["step"])
            out.append(rec)
    return out


def read_journal_dir(path: str) -> dict[int, list[dict]]:
    """group uid -> its step records, from one run directory (its ``group-U.jsonl`` files).
    ValueError naming the directory when it is missing or holds no group journal."""
    if not os.path.isdir(path):
        raise ValueError(f"--journals {path!r}: not a directory")
    files = sorted((int(m.group(1)), os.path.join(path, name))
                   for name in os.listdir(path) if (m := _GROUP_FILE.match(name)))
    if not files:
        raise ValueError(f"--journals {path!r}: no group-U.jsonl journal in it")
    try:
        return {uid: _read_file(p) for uid, p in files}
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--journals {path!r}: unreadable ({e})") from None


def read_journals(paths: Iterable[str]) -> list[dict[int, list[dict]]]:
    """One mapping per run directory (see :func:`read_journal_dir`)."""
    return [read_journal_dir(p) for p in paths]


def to_array(run: Mapping[int, list[Mapping]]) -> np.ndarray:
    """A run's groups aligned on the steps every group has: (groups, steps, FEATURES)."""
    common = None
    for recs in run.values():
        steps = {int(r["step"]) for r in recs}
        common = steps if common is None else common & steps
    steps = sorted(common or ())
    out = np.zeros((len(run), len(steps), len(FEATURES)))
    for gi, recs in enumerate(run[g] for g in sorted(run)):
        by = {int(r["step"]): r for r in recs}
        for si, s in enumerate(steps):
            out[gi, si] = [float(by[s].get(k, 0.0) or 0.0) for k in FEATURES]
    return out
