"""Plain helpers shared by the test modules: reading journals, building synthetic ones, and
playing the launcher around a ``StackedCluster`` (wait for a victim's death, post its notice,
check how a run ended).

Import as ``from helpers import ...``: ``pythonpath = ["tests"]`` in pyproject.toml puts this
directory on ``sys.path`` (the test directories have no ``__init__.py``). Fixtures live in
``conftest.py``. Nothing here imports torch at module level, so pure tests may use it too.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence


#: recorded journals (tests/data)
DATA = Path(__file__).resolve().parent / "data"


# ------------------------------------------------------------------------------ journals
def read_journal(path: str | Path) -> list[dict]:
    """The events of a JSON-lines journal, in file order; ``[]`` while it does not exist.
    A last line without its newline is still being written: it is left for the next read."""
    path = Path(path)
    if not path.exists():
        return []
    *whole, _partial = path.read_text().split("\n")
    return [json.loads(x) for x in whole if x.strip()]


def events(journal: list[dict], kind: str) -> list[dict]:
    """The events of one kind (``"commit"``, ``"replan"``, ...), in journal order."""
    return [e for e in journal if e.get("event") == kind]


def committed_steps(path: str | Path) -> list[int]:
    """The steps a journal file records as committed (``[]`` before the file exists)."""
    return [e["step"] for e in events(read_journal(path), "commit")]


def commit_lines(step: int, t: float, members: list[int], loss: float = 1.0, *, gen: int = 0,
                 gap: float = 0.003) -> list[dict]:
    """Synthetic ``commit`` events of one step: every live group journals it, ``gap`` s apart
    (only the first one counts for the time accounting)."""
    return [{"event": "commit", "step": step, "t": t + gap * i, "gen": gen, "members": members,
             "mine": [m], "plan": {}, "loss": loss, "src": f"group-{m}"}
            for i, m in enumerate(members)]


# ------------------------------------------------------------------------------ processes
def wait_while_alive(done: Callable[[], bool], procs: Sequence[subprocess.Popen],
                     timeout: float, look_every: float = 0.02) -> None:
    """Wait until ``done()`` holds while every one of ``procs`` keeps running.

    Between looks it waits on the first process's exit (at most ``look_every`` s), not a sleep:
    a process that exits ends the wait at once and fails it, as does ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done():
        gone = {p.pid: p.returncode for p in procs if p.poll() is not None}
        assert not gone, f"exited while waited on (pid: rc): {gone}"
        assert time.monotonic() < deadline, f"not done within {timeout} s"
        try:
            procs[0].wait(timeout=look_every)
        except subprocess.TimeoutExpired:
            pass


# ------------------------------------------------------------------- the launcher's part
def kill_and_notify(c, victims: list[int], alive: list[int]) -> dict[int, float]:
    """Wait until each victim of a ``StackedCluster`` has killed itself (its ``killed/<uid>``
    key, then its exit by SIGKILL) and post the death notice a launcher would.
    Returns each victim's kill time (from its key)."""
    from unbroken.runtime.ftcomm import declare_dead

    t = {}
    for v in victims:
        t[v] = c.wait_key(f"killed/{v}", 60, alive=alive)
        assert c.procs[v].wait(timeout=10) == -9  # really SIGKILLed
        declare_dead(c.store, v)
    return t


def finish(c, cfg, finishers: list[int], ref, tol: float = 1e-6,
           wait_s: float = 90) -> dict[int, list[dict]]:
    """The end of a ``StackedCluster`` run that must succeed: every finisher posts
    ``done/<uid>`` (within ``wait_s``) after all ``cfg.steps`` steps and exits 0, its
    parameters are within ``tol`` of the reference run's, and every sample was consumed
    exactly once over all journals. Returns the journals by uid (the dead members' included)."""
    import torch

    from unbroken.core.shards import exactly_once
    from unbroken.core.ledger import ledger_records

    done = {u: c.wait_key(f"done/{u}", wait_s, alive=finishers) for u in finishers}
    for u in finishers:
        assert c.procs[u].wait(timeout=30) == 0, c.stderr(u)[-2000:]
        assert done[u]["steps"] == cfg.steps
        diff = (torch.tensor(done[u]["params"], dtype=torch.float64) - ref).abs().max().item()
        assert diff < tol, (u, diff)
    journals = {u: c.journal(u) for u in c.uids}
    rep = exactly_once(ledger_records(journals), cfg.steps, cfg.groups)
    assert rep.ok and rep.records == cfg.steps * cfg.groups, rep
    return journals
