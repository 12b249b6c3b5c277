"""The one durable-write helper: a copy lands whole or not at all, digests are of the bytes."""

import hashlib
import os

import pytest

from unbroken.fsio import copy_atomic, sha256_file, write_synced


def test_copy_atomic_replaces_the_target_and_leaves_no_temporary(tmp_path):
    src, dst = tmp_path / "a.bin", tmp_path / "b.bin"
    src.write_bytes(b"new" * 1000)
    dst.write_bytes(b"old")
    assert copy_atomic(src, dst) == str(dst.resolve())
    assert dst.read_bytes() == b"new" * 1000
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_a_failed_copy_keeps_the_old_target(tmp_path):
    dst = tmp_path / "b.bin"
    dst.write_bytes(b"old")
    with pytest.raises(FileNotFoundError):
        copy_atomic(tmp_path / "missing", dst)
    assert dst.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["b.bin"]


def test_sha256_file_is_the_digest_of_what_write_synced_wrote(tmp_path):
    p = tmp_path / "m.json"
    write_synced(p, "{\"step\": 3}")
    assert sha256_file(p) == hashlib.sha256(b"{\"step\": 3}").hexdigest()
