"""ExitWaiter: wakes at a child's exit (not at the timeout), sleeps the timeout otherwise."""

import subprocess
import sys
import time

from unbroken.procwait import ExitWaiter


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_wakes_at_an_exit_well_before_the_timeout():
    w = ExitWaiter()
    long, short = _child("import time; time.sleep(30)"), _child("import time; time.sleep(0.3)")
    try:
        t0 = time.monotonic()
        while short.poll() is None:  # a wake-up without an exit may happen; loop like a caller
            w.wait([long, short], 20.0)
            assert time.monotonic() - t0 < 10
        assert short.returncode == 0 and long.poll() is None
        assert time.monotonic() - t0 < 5  # woke at the exit, not at the 20 s timeout
    finally:
        long.kill()
        long.wait()
        w.close()


def test_sleeps_the_timeout_while_every_child_runs():
    w = ExitWaiter()
    p = _child("import time; time.sleep(30)")
    try:
        t0 = time.monotonic()
        w.wait([p], 0.3)
        assert 0.25 <= time.monotonic() - t0 < 5 and p.poll() is None
    finally:
        p.kill()
        p.wait()
        w.close()


def test_returns_at_once_for_an_exited_child_and_keeps_its_exit_code():
    w = ExitWaiter()
    p = _child("raise SystemExit(7)")
    deadline = time.monotonic() + 30
    while p.poll() is None and time.monotonic() < deadline:
        w.wait([p], 1.0)
    t0 = time.monotonic()
    w.wait([p], 0.5)  # reaped already: no live child, so the timeout itself (no busy loop)
    assert p.returncode == 7
    assert time.monotonic() - t0 >= 0.45
    w.close()
