"""Live: 4 real worker processes, one stuck elsewhere; py-spy and the faulthandler fallback
both localise it to its data-parallel replica. Layout dp=2 x tp=2 (pp=1): rank r has
dp = r // 2, tp = r % 2; rank 3 is stuck, so the eviction is DP group 1 = ranks (2, 3)."""

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unbroken.core.stacks import EVICT, Coord
from unbroken.detect.stacks import (
    FAULTHANDLER,
    PYSPY,
    DumpError,
    dump_pyspy,
    localise,
    pyspy_path,
)

pytestmark = pytest.mark.mp

WORKER = Path(__file__).with_name("stacks_worker.py")
STUCK = 3
COORDS = {r: Coord(dp=r // 2, pp=0, tp=r % 2) for r in range(4)}
READY_TIMEOUT = 60.0  # four interpreters starting on a shared 2-core machine


def _read_ready(proc: subprocess.Popen, deadline: float) -> None:
    fd = proc.stdout.fileno()
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"worker {proc.pid} not ready within {READY_TIMEOUT} s")
        r, _, _ = select.select([fd], [], [], left)
        if r:
            chunk = os.read(fd, 256)
            if not chunk:
                raise AssertionError(f"worker {proc.pid} exited rc={proc.poll()}: {buf!r}")
            buf += chunk
    assert buf.startswith(b"ready "), buf


@pytest.fixture
def workers(tmp_path):
    procs = []
    try:
        for r in range(4):
            mode = "stuck" if r == STUCK else "healthy"
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), mode, str(tmp_path)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            )
        deadline = time.monotonic() + READY_TIMEOUT
        for p in procs:
            _read_ready(p, deadline)
        yield {r: p.pid for r, p in enumerate(procs)}, tmp_path
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.stdin, p.stdout):
                if f:
                    f.close()


def _check(loc, method):
    v = loc.verdict
    assert {d.method for d in loc.dumps.values()} == {method}, loc.dumps
    assert v.action == EVICT, loc.reason
    assert (v.kind, v.index) == ("dp", 1), loc.reason
    assert v.ranks == (2, 3)
    assert v.outliers == (STUCK,)
    assert v.healthy == (0, 1, 2)
    assert "stuck_in_collective" in v.clusters[1][0]
    assert "train_step" in v.clusters[0][0]
    print(f"\n{method}: " + ", ".join(f"rank {r} {d.seconds * 1e3:.1f} ms" for r, d in loc.dumps.items()))


@pytest.mark.timeout(120)
def test_pyspy_localises_stuck_worker(workers):
    pids, fault_dir = workers
    if pyspy_path() is None:
        pytest.fail("py-spy not installed: pip install -c requirements.lock '.[guard]'")
    try:
        dump_pyspy(pids[0], timeout=20)
    except DumpError as e:
        msg = str(e).lower()
        if "permission" in msg or "not permitted" in msg or "ptrace" in msg:
            pytest.skip(f"py-spy cannot attach here: {e}")
        raise
    loc = localise(pids, COORDS, timeout=20)
    _check(loc, PYSPY)


@pytest.mark.timeout(120)
def test_faulthandler_fallback_localises_stuck_worker(workers):
    pids, fault_dir = workers
    loc = localise(pids, COORDS, use_pyspy=False, fault_dir=fault_dir, timeout=20)
    _check(loc, FAULTHANDLER)
    # the workers survive the signal and can be dumped again
    again = localise(pids, COORDS, use_pyspy=False, fault_dir=fault_dir, timeout=20)
    assert again.verdict == loc.verdict


@pytest.mark.timeout(120)
def test_both_formats_normalise_alike_and_dead_pid_is_outlier(workers):
    from unbroken.core.stacks import normalise
    from unbroken.detect.stacks import FAILED, dump_stacks, read_faulthandler

    pids, fault_dir = workers
    fh = read_faulthandler(pids[STUCK], fault_dir, timeout=20)
    try:
        ps = dump_pyspy(pids[STUCK], timeout=20)
    except DumpError as e:
        pytest.skip(f"py-spy cannot attach here: {e}")
    assert normalise(fh) == normalise(ps)
    # a process that is gone cannot be dumped by either path: a failed dump, its own text
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    d = dump_stacks(gone.pid, fault_dir=fault_dir, timeout=5)
    assert d.method == FAILED and d.text.startswith("<dump failed:"), d
