"""The supervisor's journal tail: an open file that sees what is appended after each read."""

from __future__ import annotations

import json

from unbroken.events import Event
from unbroken.supervise.tail import JournalTail


def test_tail_sees_lines_appended_after_it_opened_and_holds_back_a_partial_one(tmp_path):
    path = tmp_path / "group-0.jsonl"
    tail = JournalTail(path)
    assert tail.read() == []  # not there yet: nothing, no error
    with open(path, "a", buffering=1) as w:
        w.write(json.dumps({"event": "commit", "step": 0}) + "\n")
        assert [e["step"] for e in tail.read()] == [0]
        w.write(json.dumps({"event": "commit", "step": 1}) + "\n" + '{"event": "com')
        w.flush()
        assert [e["step"] for e in tail.read()] == [1]  # the half line waits for its newline
        w.write('mit", "step": 2}\n')
        w.flush()
        assert [e["step"] for e in tail.read()] == [2]
        assert tail.read() == []
        w.write("{not json\n")
        w.flush()
        assert tail.read() == [{"event": Event.JOURNAL_DAMAGED, "file": str(path)}]
    tail.close()


def test_tail_started_past_the_old_lines_reads_only_new_ones(tmp_path):
    path = tmp_path / "group-0.jsonl"
    path.write_text(json.dumps({"event": "commit", "step": 9}) + "\n")
    tail = JournalTail(path)
    tail.pos = path.stat().st_size  # what a resumed attempt does (skip_old)
    with open(path, "a") as w:
        w.write(json.dumps({"event": "commit", "step": 10}) + "\n")
    assert [e["step"] for e in tail.read()] == [10]
    tail.close()


def test_an_attempt_drains_what_its_processes_wrote_after_its_loop_stopped_reading(tmp_path):
    # a restart ends the attempt's loop while the survivors still train until the cluster is
    # closed: their lines were skipped by the next attempt's tails (a remote-agents run that
    # trained 80 steps reported 52, and its drill's kill fired again after the restart)
    from unbroken.core.faults import Fault
    from unbroken.supervise.attempt import Attempt

    path = tmp_path / "group-0.jsonl"
    run = Attempt.__new__(Attempt)  # only what drain() uses: the tails, fired, emit
    run.tails, run.fired, got = {0: JournalTail(path)}, set(), []
    run.emit = lambda ev, src=None: got.append((ev["event"], ev.get("step"), src))
    with open(path, "w") as w:
        w.write(json.dumps({"event": "commit", "step": 6}) + "\n")
    assert [e["step"] for e in run.tails[0].read()] == [6]  # the loop's last read
    run.tails[0].close()  # the attempt's end closes its tails
    with open(path, "a") as w:  # then the survivors go on until they are killed
        for k in (7, 8):
            w.write(json.dumps({"event": "commit", "step": k}) + "\n")
        w.write(json.dumps({"event": "fault", "kind": "kill", "group": 0, "uid": 0,
                            "step": 9, "at": 9}) + "\n")
    run.drain()
    assert got == [("commit", 7, "group-0"), ("commit", 8, "group-0"), ("fault", 9, "group-0")]
    assert run.fired == {Fault("kill", 0, 9)}  # not injected again by the next attempt
    run.drain()
    assert len(got) == 3  # each line once


def test_an_attempt_ending_on_a_stop_reads_what_the_members_wrote_just_before_they_exited(
        tmp_path):
    # a member journals its last commits and the stop's checkpoint, then exits. A tick that
    # read the journals just before and saw the exits just after ended the run naming an
    # older step and no checkpoint (a remote-agents run under load: "after step 82", None)
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    import pytest
    import torch.distributed as dist

    from unbroken.guard.guard import Guard
    from unbroken.protocol import ExitCode
    from unbroken.supervise.attempt import Attempt
    from unbroken.supervise.outcome import Ended

    path = tmp_path / "group-0.jsonl"
    with open(path, "w") as w:
        w.write(json.dumps({"event": "commit", "step": 5, "t": time.time()}) + "\n")
    got: list[dict] = []
    run = Attempt.__new__(Attempt)  # what the loop's exit check and its events use
    run.c = SimpleNamespace(uids=[0], store=dist.HashStore(), journal_dir=str(tmp_path))
    run.spec = SimpleNamespace(steps=100)
    run.emit = lambda ev, src=None: got.append(ev)
    run.guard, run.signalled = Guard(run.emit), lambda: None
    run.members, run.joined, run.finished, run.stopped = {0}, {0}, {}, {}
    run.handled, run.stop_posted, run.stop_code = set(), None, None
    run.tails, run.skip_old, run.fired, run.victims = {}, False, set(), set()
    run.restarting, run.restored, run.restarts = False, False, set()
    run.top, run.last_step_t, run.checkpoint = -1, time.time(), None
    for ev in run._tail(0).read():  # the tick's read
        run._on_event(0, ev)
    assert run.top == 5
    ckpt = str(tmp_path / "ckpt" / "step-00000008")
    last = [{"event": "commit", "step": k, "t": time.time()} for k in (6, 7)] + [
        {"event": "stopped", "step": 8, "checkpoint": ckpt, "t": time.time()}]
    member = subprocess.Popen(  # a real process: it writes, then exits with the stop's code
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2]); "
         f"sys.exit({int(ExitCode.STOPPED)})", str(path),
         "".join(json.dumps(e) + "\n" for e in last)])
    assert member.wait(timeout=60) == ExitCode.STOPPED
    run.c.procs = {0: member}
    with pytest.raises(Ended) as ended:
        run._exits()
    assert ended.value.checkpoint == ckpt and "after step 7;" in str(ended.value), ended.value
    assert [e["step"] for e in got if e["event"] == "commit"] == [5, 6, 7]
