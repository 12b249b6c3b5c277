"""Durable file writes and digests, one copy for the whole house.

A resume point is only as good as the bytes under it: checkpoints, the supervisor's copy of
a selector, and the sync face's model files all write a temporary file in the target's
directory, flush and fsync it, ``os.replace`` it over the target and fsync the directory, so
a crash leaves the old file or the new one, never half of one. The digests here are what
manifests and journal events record; reading a file in chunks keeps a large one off the heap.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

__all__ = ["sha256_file", "write_synced", "fsync_dir", "copy_atomic"]


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_synced(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` and fsync it (the caller renames or fsyncs the directory)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory, so that a rename inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_atomic(src: str | os.PathLike, dst: str | os.PathLike) -> str:
    """Copy ``src`` to ``dst`` atomically (temporary file, fsync, replace, directory fsync);
    dst's resolved path."""
    dst = Path(dst)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(dst.parent)
    return str(dst.resolve())
