"""detect.xid_source: tail a saved kernel log incrementally, never raise."""

import os
import subprocess

import pytest

from unbroken.core.xid import INVESTIGATE, REBOOT_NODE, RESET_GPU, RESTART_APP
from unbroken.detect.xid_source import DmesgSource, XidSource

X79 = ("[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
       "GPU has fallen off the bus.\n")
X119 = "[ 1300.000001] NVRM: Xid (PCI:0000:18:00): 119, pid='<unknown>', name=<unknown>, Timeout\n"
X31 = "[ 1400.5] NVRM: Xid (PCI:0000:86:00): 31, pid=77, name=python, Ch 00000010, MMU Fault\n"
NOISE = "[    0.000000] Linux version 6.1.0 (gcc) #1 SMP\n"
BAD = "[ 1500.0] NVRM: Xid (PCI:0000:3b:00): oops\n"


def _append(path, text, mode="a"):
    with open(path, mode) as f:
        f.write(text)


def test_reads_appended_lines_incrementally(tmp_path):
    log = tmp_path / "kern.log"
    _append(log, NOISE + X79, "w")
    src = XidSource(log)
    r = src.poll()
    assert [(h.event.code, h.action) for h in r.hits] == [(79, REBOOT_NODE)]
    assert r.malformed == [] and r.problems == []
    assert "evict at once" in r.hits[0].reason
    assert src.poll() == ([], [], [])                       # nothing new
    _append(log, NOISE + X119 + X31)
    r = src.poll()
    assert [(h.event.code, h.action) for h in r.hits] == [(119, RESET_GPU), (31, RESTART_APP)]
    assert src.lines == 5


def test_a_line_without_its_newline_waits_for_the_next_poll(tmp_path):
    log = tmp_path / "kern.log"
    _append(log, X79 + X119[:30], "w")
    src = XidSource(log)
    assert [h.event.code for h in src.poll().hits] == [79]
    _append(log, X119[30:])
    assert [h.event.code for h in src.poll().hits] == [119]


def test_malformed_lines_are_reported_beside_events_without_raising(tmp_path):
    log = tmp_path / "kern.log"
    _append(log, NOISE + X79 + BAD + "\xff garbage \x00\n", "w")
    src = XidSource(log)
    r = src.poll()
    assert [h.event.code for h in r.hits] == [79]
    assert len(r.malformed) == 1 and r.malformed[0].lineno == 3 and "oops" in r.malformed[0].line
    _append(log, BAD + "NVRM: Xid (PCI:0000:3b:00): 1234567, odd but readable\n")
    r = src.poll()
    assert r.malformed[0].lineno == 5                       # numbered within the whole file
    assert [h.action for h in r.hits] == [INVESTIGATE]


def test_survives_truncation_and_rotation(tmp_path):
    log = tmp_path / "kern.log"
    _append(log, NOISE * 3 + X79, "w")
    src = XidSource(log)
    assert len(src.poll().hits) == 1
    _append(log, X31, "w")                                  # truncated (shorter than offset)
    r = src.poll()
    assert [h.event.code for h in r.hits] == [31] and "truncated" in r.problems[0]
    # rewritten in place, longer than before: the head changed, so start over
    _append(log, X119 + NOISE * 5 + X79, "w")
    r = src.poll()
    assert [h.event.code for h in r.hits] == [119, 79] and "rewritten" in r.problems[0]
    # rotated: a new file (new inode) under the same name
    os.rename(log, tmp_path / "kern.log.1")
    _append(log, X31, "w")
    r = src.poll()
    assert [h.event.code for h in r.hits] == [31] and "rotated" in r.problems[0]


def test_missing_file_is_reported_once_then_read_when_it_appears(tmp_path):
    log = tmp_path / "kern.log"
    src = XidSource(log)
    r = src.poll()
    assert r.hits == [] and len(r.problems) == 1 and "missing" in r.problems[0]
    assert src.poll().problems == []                        # once, not every poll
    _append(log, X79, "w")
    r = src.poll()
    assert [h.event.code for h in r.hits] == [79] and r.problems == []
    log.unlink()
    assert "missing" in src.poll().problems[0]              # a new outage is reported again
    assert src.poll().problems == []


def test_an_unreadable_path_is_reported_not_raised(tmp_path):
    src = XidSource(tmp_path)                               # a directory
    r = src.poll()
    assert r.hits == [] and len(r.problems) == 1


def _proc(stdout=b"", stderr=b"", rc=0):
    return subprocess.CompletedProcess(["dmesg"], rc, stdout, stderr)


def test_dmesg_source_returns_only_new_lines_and_degrades():
    ring = [NOISE.encode(), X79.encode()]
    src = DmesgSource(run=lambda cmd: _proc(b"".join(ring)))
    assert [h.event.code for h in src.poll().hits] == [79]
    assert src.poll().hits == []
    ring.append(X31.encode())
    assert [h.event.code for h in src.poll().hits] == [31]

    denied = DmesgSource(run=lambda cmd: _proc(
        stderr=b"dmesg: read kernel buffer failed: Operation not permitted\n", rc=1))
    r = denied.poll()
    assert r.hits == [] and "not permitted" in r.problems[0]
    assert denied.poll().problems == []                     # reported once

    def missing(cmd):
        raise FileNotFoundError(cmd[0])
    assert "not found" in DmesgSource(run=missing).poll().problems[0]


@pytest.mark.mp  # runs the real dmesg
def test_real_dmesg_is_read_or_its_refusal_reported_once():
    src = DmesgSource()
    first, again = src.poll(), src.poll()                   # whatever this machine allows
    if first.problems:  # no access (a container, dmesg_restrict): one line, no events
        assert first.hits == [] and len(first.problems) == 1, first
        assert "\n" not in first.problems[0]
    assert again.problems == []                             # a refusal is reported once
    assert again.hits == [], again                          # only lines new since the first

