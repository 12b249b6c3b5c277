"""Fixtures shared by the test modules; plain helpers are in ``helpers.py``.

Markers (registered in pyproject.toml): ``mp`` for a test that starts OS processes (worker
clusters, the CLI or the demo in a subprocess, a process pool, py-spy on live processes),
``server`` for one that serves on a local port (the Prometheus exporter), ``timing`` for one
that compares the speeds of processes (``make test`` runs those alone, after the rest). The
pure tests alone: ``pytest -m "not mp and not server"``; the default ``pytest`` runs everything.

``make test`` runs on two pytest-xdist workers with ``--dist loadscope`` (a module at a time
each), so two process tests may run side by side. Not ``loadgroup``: pytest-xdist 3.8 marks a
group by rewriting ``item._nodeid``, which pytest 9.2 no longer reads, so its groups are
silently ignored (this file put every process test in one group until 2026-12-07, and they
ran two at a time all along).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository root

# One torch thread in the test process (and the processes it starts), as every worker already
# runs (stacked_worker sets 1): on a shared 2-core machine torch's default intra-op threads spin
# against each other and the workers -- test_gpt's reference run took 4 s with one thread and
# 13-56 s with two under load. Set before any test module imports torch; an explicit
# OMP_NUM_THREADS is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# fixtures that start a process: a test using one must carry the ``mp`` marker
_PROCESS_FIXTURES = ("cli", "demo")


def pytest_collection_modifyitems(config, items):
    """Keep ``-m "not mp"`` honest: a test that runs the CLI through a fixture but is not marked
    ``mp`` is a collection error, not a slow surprise in the pure run."""
    unmarked = []
    for item in items:
        uses = [f for f in _PROCESS_FIXTURES if f in item.fixturenames]
        if uses and item.get_closest_marker("mp") is None:
            unmarked.append(f"{item.nodeid} (uses {', '.join(uses)})")
    if unmarked:
        raise pytest.UsageError("starts a process but is not marked mp: " + "; ".join(unmarked))


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess]:
    """``cli(*args, timeout=120, cwd=ROOT)``: run ``python -m unbroken ARGS`` as a user would,
    in a real subprocess started in the repository root (``examples.*`` importable); its
    ``CompletedProcess`` (text stdout and stderr). A test using it is ``mp``."""

    def run(*args: str, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "unbroken", *args], capture_output=True,
                              text=True, timeout=timeout, cwd=cwd)

    return run


@pytest.fixture
def demo(cli) -> Callable[..., dict]:
    """``demo(*args, timeout=180)``: run ``unbroken demo ARGS --json`` as a user would; it must
    exit 0; its one JSON object (the report). A test using it is ``mp``."""

    def run(*args: str, timeout: float = 180) -> dict:
        p = cli("demo", *args, "--json", timeout=timeout)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout)

    return run
