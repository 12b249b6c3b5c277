"""The supervisor never loses work and never hangs the job: ``unbroken run`` as a real process
tree, stopped (SIGSTOP), interrupted (SIGINT / SIGTERM) and killed during start-up.

Processes are found by their command line (every worker's names the run directory), waited on
by polling their existence with a deadline, never by a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from unbroken.supervise.outdir import read_journal  # noqa: E402

pytestmark = pytest.mark.mp


def start(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "unbroken", "run", "--trainer", "mlp",
                             "--out", str(out), "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def procs_of(out: Path) -> list[int]:
    """Pids of the processes (workers, spares) whose command line names ``out``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().split()[2]
        except OSError:
            continue
        if str(out / "groups") in cmd and "stacked_worker" in cmd and state != "Z":
            found.append(int(d.name))
    return found


def wait_until(cond, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() > deadline:
            err = proc.stderr.read() if proc is not None and proc.poll() is not None else ""
            raise AssertionError(f"no {what} within {timeout}s {err[-2000:]}")
        if proc is not None:
            try:
                proc.wait(timeout=0.05)  # an exit is an event worth waking for
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(0.05)  # polling /proc: there is no event to wait on
    return v


def group_events(out: Path) -> dict[int, list[dict]]:
    return {int(f.stem.split("-")[1]): read_journal(f)  # skips a line still being written
            for f in sorted((out / "groups").glob("group-*.jsonl"))}


def committed(out: Path) -> int:
    return max((e["step"] for evs in group_events(out).values() for e in evs
                if e.get("event") == "commit"), default=-1)


def finish_by_resume(cli, out: Path, steps: int) -> dict:
    p = cli("run", "--trainer", "mlp", "--steps", str(steps), "--faults", "none", "--spares",
            "0", "--out", str(out), "--resume", "--json", timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads(p.stdout)
    assert rep["exactly_once"] is True and rep["ledger"]["records"] == steps * 4, rep["ledger"]
    return rep


@pytest.mark.timeout(300)
def test_a_stopped_supervisor_makes_every_member_stop_with_a_checkpoint(cli, tmp_path):
    out, steps = tmp_path / "run", 2000
    sup = start(out, "--steps", str(steps), "--faults", "none", "--spares", "0",
                "--supervisor-staleness", "2")
    try:
        wait_until(lambda: committed(out) >= 10, 120, "10 steps", sup)
        sup.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        wait_until(lambda: not procs_of(out), 60, "members stopping")
        gone_s = time.monotonic() - t0
        sup.send_signal(signal.SIGCONT)
        rc = sup.wait(timeout=60)
        err = sup.stderr.read()
    finally:
        sup.kill()
    assert rc == 5, err[-2000:]
    assert "Traceback" not in err and "silent" in err, err
    assert gone_s < 30, gone_s  # 2 s silence, then the step in flight and a checkpoint
    lost = [e for evs in group_events(out).values() for e in evs
            if e["event"] == "coordinator_lost"]
    assert len(lost) == 4 and len({e["step"] for e in lost}) == 1, lost
    stop = lost[0]["step"]
    assert 10 < stop < steps
    written = [e["checkpoint"] for e in lost if e["checkpoint"]]
    assert len(written) == 1 and written[0].endswith(f"step-{stop:08d}")
    rep = finish_by_resume(cli, out, steps=stop + 5)  # a restarted supervisor continues
    assert rep["steps"] == 5


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_stop_every_member_after_one_step_with_a_checkpoint(
        cli, tmp_path, sig, code):
    out, steps = tmp_path / "run", 2000
    sup = start(out, "--steps", str(steps), "--faults", "none", "--spares", "1",
                "--ckpt-every", "1000")  # no periodic checkpoint to fall back on
    try:
        wait_until(lambda: committed(out) >= 10, 120, "10 steps", sup)
        sup.send_signal(sig)
        rc = sup.wait(timeout=60)
        err = sup.stderr.read()
        left = procs_of(out)
    finally:
        sup.kill()
    assert rc == code, err[-2000:]
    lines = [x for x in err.splitlines() if x.strip() and "unbroken:" in x]
    assert len(lines) == 1 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert left == [], left  # workers and the spare: nothing is left behind
    stops = [e for evs in group_events(out).values() for e in evs if e["event"] == "stopped"]
    assert len(stops) == 4 and len({e["step"] for e in stops}) == 1, stops
    stop = stops[0]["step"]
    written = [e["checkpoint"] for e in stops if e["checkpoint"]]
    assert len(written) == 1 and written[0].endswith(f"step-{stop:08d}")
    assert written[0] in lines[0]  # the one line says where the state is
    if sig == signal.SIGINT:  # (the same checkpoint and resume path after either signal)
        rep = finish_by_resume(cli, out, steps=stop + 3)
        assert rep["steps"] == 3


@pytest.mark.timeout(120)
def test_workers_die_with_a_supervisor_killed_during_start_up(tmp_path):
    out = tmp_path / "run"
    sup = start(out, "--steps", "50", "--faults", "none", "--spares", "2")
    try:
        wait_until(lambda: len(procs_of(out)) >= 6, 60, "6 worker processes", sup)
        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=10)
        t0 = time.monotonic()
        wait_until(lambda: not procs_of(out), 20, "workers exiting")
        assert time.monotonic() - t0 < 5
    finally:
        sup.kill()
        for pid in procs_of(out):
            os.kill(pid, signal.SIGKILL)
