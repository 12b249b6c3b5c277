"""``unbroken run`` as a user types it: bad input is one line and exit 2 with nothing started,
a second run into the same --out is refused, --resume with nothing to resume is exit 7; the
example model trains through a worker SIGKILLed from outside, exactly once."""

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

from helpers import read_journal  # noqa: E402

pytestmark = pytest.mark.mp  # every test runs `unbroken run` in a subprocess

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, named", [
    (["--trainer", "nosuch.mod:make"], "cannot import 'nosuch.mod'"),
    (["--trainer", "unbroken.core.units:nope"], "has no 'nope'"),
    (["--trainer", "nocolon"], "expected 'package.module:factory'"),
    (["--trainer", "builtins:str"], "returned a str, not a trainer"),
    (["--trainer", "json:dumps"], "the factory raised TypeError"),
    (["--trainer", "mlp", "--trainer-args", "{bad"], "--trainer-args '{bad': not JSON"),
    (["--trainer", "mlp", "--trainer-args", "[1, 2]"], "expected a JSON object"),
    (["--trainer", "examples.tiny_lm:make", "--trainer-args", '{"depth": 3}'],
     "unexpected keyword argument 'depth'"),
    # the built-ins take their hyperparameters the same way: a misspelt one is bad input
    (["--trainer", "mlp", "--trainer-args", '{"hiden": 4}'], "unexpected keyword argument 'hiden'"),
    (["--trainer", "gpt", "--trainer-args", '{"d_modle": 32}'],
     "unexpected keyword argument 'd_modle'"),
])
def test_a_bad_trainer_is_one_line_exit_2_and_nothing_started(cli, tmp_path, args, named):
    p = cli("run", *args, "--out", str(tmp_path / "run"))
    assert p.returncode == 2, p.stderr
    assert named in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "run").exists()


def test_resume_with_nothing_to_resume_is_exit_7(cli, tmp_path):
    p = cli("run", "--trainer", "mlp", "--resume", "--out", str(tmp_path / "typo"))
    assert p.returncode == 7 and "holds no previous run" in p.stderr, p.stderr
    assert not (tmp_path / "typo").exists()


@pytest.mark.timeout(300)
def test_the_example_trains_through_a_worker_killed_from_outside(cli, tmp_path):
    """The README's walk-through: the user's own transformer, one worker SIGKILLed by pid from
    outside mid-run; the run finishes every step exactly once. Then running into the same
    --out again is refused (the resume point stays)."""
    out = tmp_path / "example"
    cmd = [sys.executable, "-m", "unbroken", "run", "--trainer", "examples.tiny_lm:make",
           "--trainer-args", '{"d_model": 32}', "--steps", "60", "--spares", "1",
           "--ckpt-every", "20", "--out", str(out), "--json"]
    sup = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        victim = None
        deadline = time.monotonic() + 120
        while victim is None:  # group 1's pid, once it has committed a few steps
            assert sup.poll() is None and time.monotonic() < deadline, sup.stderr.read()
            j = out / "groups" / "group-1.jsonl"
            if j.exists() and j.read_text().count('"event": "commit"') >= 5:
                victim = next(int(d.name) for d in Path("/proc").iterdir()
                              if d.name.isdigit() and "--uid 1 " in _cmd(d)
                              and str(out / "groups") in _cmd(d))
            else:
                try:
                    sup.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = sup.communicate(timeout=240)
    finally:
        sup.kill()
    assert sup.returncode == 0, stderr[-3000:]
    rep = json.loads(stdout)
    assert rep["steps"] == 60 and rep["exactly_once"] is True
    assert rep["ledger"]["records"] == 60 * 4 and rep["ledger"]["missing"] == 0
    # nothing was injected: the kill came from outside, and is accounted as a real failure
    assert rep["faults_injected"] == 0 and rep["faults_external"] == 1
    assert rep["faults_masked"] == 1 and rep["faults_detected"] == 1
    (f,) = rep["time_lost_per_fault"]
    assert f["kind"] == "death" and f["group"] == 1 and f["masked"]
    events = read_journal(out / "journal.jsonl")
    assert any(e["event"] == "detected" and e["slot"] == 1 and e["how"] == "exit"
               for e in events)
    assert any(e["event"] == "join" and e["slot"] == 1 for e in events)
    assert rep["final_loss"] < 3.0  # a 30-symbol vocabulary starts near ln 30 = 3.4
    again = cli("run", "--trainer", "examples.tiny_lm:make", "--steps", "60",
                     "--out", str(out))
    assert again.returncode == 2 and "holds a previous run" in again.stderr
    assert any((out / "ckpt").glob("step-*"))


@pytest.mark.timeout(200)
def test_every_group_killed_at_once_restarts_from_the_checkpoint(cli, tmp_path):
    """Every group SIGKILLed in the same step, with warm spares: the spares sent to the slots
    have no trained member to copy the state from, so the job restarts from its checkpoint.
    Before, they waited 120 s for an admission nobody could give and the run failed on it."""
    out = tmp_path / "all"
    t0 = time.monotonic()
    r = cli("run", "--trainer", "mlp", "--groups", "4", "--steps", "40", "--spares", "4",
            "--ckpt-every", "10", "--faults", "kill:0@15,kill:1@15,kill:2@15,kill:3@15",
            "--out", str(out), "--json", timeout=150)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["steps"] == 40 and rep["exactly_once"] is True
    assert rep["faults_injected"] == 4 and rep["restarts"] == 1
    events = read_journal(out / "journal.jsonl")
    (lost,) = [e for e in events if e["event"] == "ladder" and "no state to join" in e["for"]]
    assert lost["fault"] == "wipe-out" and lost["groups"] == []
    (restart,) = [e for e in events if e["event"] == "restart"]
    # the newest durable checkpoint: step 10's, or none when its write (in the background)
    # had not finished by the kills five steps later (a loaded CI run)
    assert (restart["step"], restart["source"]) in ((10, "checkpoint"), (0, "none")), restart
    assert took < 100, f"{took:.0f}s: the spares' 120 s admission timeout decided it"


def _cmd(d: Path) -> str:
    try:
        return (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""

