"""unbroken's own journals as exclusion history: the ladder's evictions and the quarantines.

Why: a cluster run with unbroken already records every eviction as an event
(``events.Event.LADDER`` with rung ``evict``, ``Event.QUARANTINE``); the exclusion analysis
(``core.history.exclusion_summary``) counts them beside sacct's notes. The "node" of a journal
exclusion is the data-parallel group (``group-<g>``): that is what the runtime evicts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from unbroken.core.history import Exclusion
from unbroken.events import Event

__all__ = ["read_journal_exclusions"]


def read_journal_exclusions(run_dir: str) -> tuple[list[Exclusion], list[str]]:
    path = Path(run_dir) / "journal.jsonl" if os.path.isdir(run_dir) else Path(run_dir)
    if not path.exists():
        raise ValueError(f"--journal {run_dir}: no journal.jsonl there")
    out, warnings = [], []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                warnings.append(f"{path.name}:{lineno}: not JSON; skipped")
                continue
            t = ev.get("t")
            if not isinstance(t, (int, float)):
                continue
            if ev.get("event") == Event.LADDER and ev.get("rung") == "evict":
                out += [Exclusion(f"group-{g}", float(t), "journal")
                        for g in ev.get("groups") or []]
            elif ev.get("event") == Event.QUARANTINE and "group" in ev:
                out.append(Exclusion(f"group-{ev['group']}", float(t), "journal"))
    return out, warnings
