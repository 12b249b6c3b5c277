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
