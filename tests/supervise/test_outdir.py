"""The run directory rules: a resume point is never destroyed, never silently replaced by a
start from step 0, and a damaged journal is named, not a traceback."""

from __future__ import annotations

import json
import os

import pytest

from unbroken.supervise.outdir import (
    JournalError,
    NoResumePoint,
    OutDirError,
    prepare,
    read_journal,
    repair_journals,
)


def fake_run(out, checkpoints=()):
    (out / "groups").mkdir(parents=True)
    (out / "journal.jsonl").write_text('{"event": "start"}\n')
    (out / "groups" / "group-0.jsonl").write_text('{"event": "commit", "step": 0}\n')
    for step in checkpoints:
        d = out / "ckpt" / f"step-{step:08d}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text("{}")  # no valid manifest: does not verify


def test_a_new_directory_is_created_and_nothing_is_found(tmp_path):
    found = prepare(tmp_path / "a" / "b", resume=False, fresh=False)
    assert (tmp_path / "a" / "b").is_dir() and found == {"resume_step": None, "kept_in": None}


def test_running_again_into_a_previous_run_is_refused_and_keeps_it(tmp_path):
    fake_run(tmp_path, checkpoints=[50])
    with pytest.raises(OutDirError, match="holds a previous run: --resume continues it"):
        prepare(tmp_path, resume=False, fresh=False)
    assert (tmp_path / "ckpt" / "step-00000050").is_dir()
    assert (tmp_path / "journal.jsonl").exists()


def test_fresh_moves_the_previous_run_aside_instead_of_deleting_it(tmp_path):
    fake_run(tmp_path, checkpoints=[50])
    (tmp_path / "reference-abc.pt").write_text("cache")  # not part of a run: stays
    found = prepare(tmp_path, resume=False, fresh=True, now=0.0)
    kept = tmp_path / "previous-19700101-000000"
    assert found["kept_in"] == str(kept)
    assert (kept / "ckpt" / "step-00000050").is_dir() and (kept / "journal.jsonl").exists()
    assert (kept / "groups" / "group-0.jsonl").exists()
    assert not (tmp_path / "journal.jsonl").exists() and not (tmp_path / "ckpt").exists()
    assert (tmp_path / "reference-abc.pt").exists()
    fake_run(tmp_path)  # a second fresh start in the same second gets its own folder
    assert prepare(tmp_path, resume=False, fresh=True, now=0.0)["kept_in"] == f"{kept}-2"


def test_resume_of_a_mistyped_directory_is_refused_and_creates_nothing(tmp_path):
    with pytest.raises(NoResumePoint, match="holds no previous run"):
        prepare(tmp_path / "typo", resume=True, fresh=False)
    assert not (tmp_path / "typo").exists()


def test_resume_when_every_checkpoint_is_corrupt_is_refused(tmp_path):
    pytest.importorskip("torch")
    fake_run(tmp_path, checkpoints=[10, 20])
    with pytest.raises(NoResumePoint, match=r"2 checkpoint\(s\), none verifies"):
        prepare(tmp_path, resume=True, fresh=False)
    assert (tmp_path / "ckpt" / "step-00000020").is_dir()  # refused, not cleaned up


def test_resume_finds_the_newest_checkpoint_that_verifies(tmp_path):
    torch = pytest.importorskip("torch")
    from unbroken.runtime.checkpoint import CheckpointStore

    fake_run(tmp_path)
    store = CheckpointStore(tmp_path / "ckpt")
    for step in (10, 20):
        store.save_async(step, [torch.arange(4.0)], {"step": step})
        store.wait()
    data = sorted((tmp_path / "ckpt" / "step-00000020").glob("*.distcp"))[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert prepare(tmp_path, resume=True, fresh=False)["resume_step"] == 10


@pytest.mark.parametrize("make", ["file", "proc"])
def test_an_out_dir_that_cannot_be_written_is_named(tmp_path, make):
    path = tmp_path / "afile" if make == "file" else "/proc/self/nope/run"
    if make == "file":
        path.write_text("x")
    with pytest.raises(OutDirError) as e:
        prepare(type(tmp_path)(path), resume=False, fresh=False)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_line_cut_off_mid_write_is_skipped_and_repaired_before_appending(tmp_path):
    (tmp_path / "groups").mkdir()
    j = tmp_path / "groups" / "group-1.jsonl"
    j.write_text('{"event": "commit", "step": 0}\n{"event": "commit", "st')
    assert read_journal(j) == [{"event": "commit", "step": 0}]
    assert repair_journals(tmp_path) == [str(j)]
    with open(j, "a") as f:
        f.write(json.dumps({"event": "commit", "step": 1}) + "\n")
    assert [e["step"] for e in read_journal(j)] == [0, 1]
    assert repair_journals(tmp_path) == []  # a whole journal is left alone


def test_a_damaged_line_in_the_middle_names_the_file_and_line(tmp_path):
    j = tmp_path / "journal.jsonl"
    j.write_text('{"event": "start"}\n{"event": "commit", "st\n{"event": "end"}\n')
    with pytest.raises(JournalError, match=rf"{j}:2: not a JSON line"):
        read_journal(j)
    with pytest.raises(JournalError, match=f"{j}:2"):
        repair_journals(tmp_path)
    assert os.path.getsize(j) > 0
