"""Model files of the sync face (the straggler predictor, the ML selector): one file, a checksum,
written atomically. In the runtime because a worker loads the selector it decides with.

Layout: one header line ``unbroken-sync-model 1 <kind> sha256=<hex>\\n`` followed by a
``torch.save`` payload of ``{"meta": ..., "state": ...}`` (tensors and plain data only, loaded
with ``weights_only=True``). The digest covers the payload. Written as the house writes
checkpoints (``runtime.checkpoint``): a temporary file in the same directory, flushed and
fsynced, ``os.replace``\\ d over the target, then the directory fsynced -- a crash leaves the
old file or the new one, never half of one. :func:`load` refuses a file that does not parse,
does not match its digest or holds another kind of model, with one line naming the file.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile

from unbroken.fsio import fsync_dir

__all__ = ["ModelFileError", "save", "load", "load_model"]

_MAGIC = b"unbroken-sync-model 1 "


class ModelFileError(ValueError):
    """A model file that does not load or verify; the message names the file."""


def save(path: str, kind: str, state: dict, meta: dict) -> str:
    """Write ``{"meta", "state"}`` of a ``kind`` model to ``path`` atomically; its sha256."""
    import torch

    buf = io.BytesIO()
    torch.save({"meta": meta, "state": state}, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    except OSError as e:
        raise ModelFileError(f"--out {path!r}: cannot write ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + f"{kind} sha256={digest}\n".encode())
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(d)
    return digest


def load(path: str, kind: str) -> tuple[dict, dict]:
    """(state, meta) of the ``kind`` model in ``path``; ModelFileError naming the file."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ModelFileError(f"model file {path!r}: unreadable ({e.strerror or e})") from None
    head, nl, payload = raw.partition(b"\n")
    if not nl or not head.startswith(_MAGIC):
        raise ModelFileError(f"model file {path!r}: not an unbroken sync model")
    try:
        got_kind, sha = head[len(_MAGIC):].decode().split(" ")
        digest = sha.removeprefix("sha256=")
    except (UnicodeDecodeError, ValueError):
        raise ModelFileError(f"model file {path!r}: bad header") from None
    if got_kind != kind:
        raise ModelFileError(f"model file {path!r}: holds a {got_kind}, not a {kind}")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ModelFileError(f"model file {path!r}: checksum mismatch (corrupt or truncated)")
    import torch  # only for a file that passed its checksum

    try:
        doc = torch.load(io.BytesIO(payload), weights_only=True)
        return doc["state"], doc["meta"]
    except Exception as e:  # noqa: BLE001 -- any unpickling failure is a bad file
        raise ModelFileError(f"model file {path!r}: does not load "
                             f"({type(e).__name__})") from None


def load_model(path: str, kind: str, cls):
    """``cls(state, meta)`` of the ``kind`` saved in ``path``, its network built: a file whose
    weights do not fit the network is refused here, with one line naming it."""
    state, meta = load(path, kind)
    obj = cls(state, meta)
    try:
        obj.model()
    except (RuntimeError, KeyError) as e:
        raise ModelFileError(f"model file {path!r}: weights do not fit the {kind} "
                             f"({type(e).__name__})") from None
    return obj
