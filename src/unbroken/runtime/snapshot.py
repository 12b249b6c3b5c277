"""In-memory snapshot of the committed training state, servable to a peer after a wipe-out.

Why a preallocated copy
-----------------------
A snapshot is taken after *every* committed step, and the budget is at most 3 % of the step
time. So :meth:`Snapshot.capture` is a plain memcpy: the constructor sizes ONE flat byte
buffer to the template (each tensor gets an aligned slice, viewed once in its own dtype and
shape), and a capture is one ``copy_`` per tensor into those views. No allocation, no
serialisation, no hashing on the step path. Mixed dtypes are supported (an optimizer's
float32 ``step`` next to float64 parameters) because the buffer holds raw bytes.

Why the digest is lazy
----------------------
Most snapshots are overwritten by the next step without ever being read. The sha256 (buffer
bytes + canonical meta JSON) is only needed when the snapshot is served to a peer, so
:meth:`Snapshot.digest` computes it on demand and caches it until the next capture. The
receiver checks what it got with :meth:`Snapshot.verify` (or :meth:`Snapshot.receive`).

Why any survivor can serve it
-----------------------------
In pure data parallelism every group holds a full replica, so every group's snapshot
describes the *whole* committed state: each one is a backup of the others, held outside the
group it backs up. When a group is wiped out, any survivor can serve the snapshot to the
replacement. With tensor/pipeline-parallel shards a snapshot would describe one shard only,
and the peer chosen to serve it would have to hold a copy of *that* shard.

Padding between slices is zero and never written, so two snapshots of equal state have
equal bytes and equal digests on every peer.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Sequence

import torch

__all__ = ["SnapshotError", "Snapshot"]

_MAGIC = b"UNBSNAP1"
_ALIGN = 64  # every slice starts on a cache line, and any dtype view of it is aligned
_SHA = 32


class SnapshotError(ValueError):
    """A snapshot does not match what it claims (checksum, layout, truncation, ...)."""


def _canonical(meta: dict) -> str:
    try:
        return json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"snapshot meta is not JSON-able: {exc}") from None


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise SnapshotError(f"unknown dtype {name!r} in snapshot")
    return dt


def _layout(tensors: Sequence[torch.Tensor]) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(t.shape), str(t.dtype)) for t in tensors]


def _mismatch(want: list, got: list) -> str | None:
    """One line naming the first difference between two layouts, or None if equal."""
    if len(want) != len(got):
        return f"expected {len(want)} tensors, got {len(got)}"
    for i, ((ws, wd), (gs, gd)) in enumerate(zip(want, got)):
        if ws != gs:
            return f"tensor {i}: shape {list(gs)} != expected {list(ws)}"
        if wd != gd:
            return f"tensor {i}: dtype {gd} != expected {wd}"
    return None


def _bytes_of(buf: torch.Tensor) -> memoryview:
    return memoryview(buf.detach().cpu().numpy()).cast("B")


class Snapshot:
    """One preallocated copy of the committed state (see the module docstring).

    ``template`` fixes the layout (count, shapes, dtypes, order); every later ``capture``,
    ``restore_into`` and ``from_bytes`` must match it. ``device`` is where the buffer lives
    (host memory by default, so it does not compete with the model for accelerator memory).
    """

    def __init__(self, template: Sequence[torch.Tensor], device: str | torch.device = "cpu"):
        self._layout = _layout(template)
        offsets, off = [], 0
        for t in template:
            off = -(-off // _ALIGN) * _ALIGN
            offsets.append(off)
            off += t.numel() * t.element_size()
        self._offsets = offsets
        self._buf = torch.zeros(off, dtype=torch.uint8, device=device)
        self._views = [
            self._buf[o:o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for o, t in zip(offsets, template)
        ]
        self._meta_json: str | None = None
        self._step: int | None = None
        self._digest: str | None = None

    # -- step path ----------------------------------------------------------------------------
    def capture(self, tensors: Sequence[torch.Tensor], meta: dict) -> None:
        """Copy ``tensors`` into the buffer (memcpy only) and record ``meta`` (JSON-able,
        must hold an int ``"step"``)."""
        self._check(tensors)
        step = meta.get("step")
        if not isinstance(step, int):
            raise SnapshotError(f"snapshot meta needs an int 'step', got {step!r}")
        meta_json = _canonical(meta)
        # Invalidate first: a copy that fails half way must not keep the old digest/meta.
        self._meta_json = self._step = self._digest = None
        with torch.no_grad():  # one call for every tensor: ~120 copy_ calls cost 1 ms a step
            torch._foreach_copy_(self._views, list(tensors))
        self._meta_json, self._step = meta_json, step

    def _check(self, tensors: Sequence[torch.Tensor]) -> None:
        got = _layout(tensors)
        if got != self._layout:
            raise SnapshotError(f"snapshot template mismatch: {_mismatch(self._layout, got)}")

    # -- state --------------------------------------------------------------------------------
    @property
    def captured(self) -> bool:
        return self._meta_json is not None

    @property
    def step(self) -> int | None:
        return self._step

    @property
    def meta(self) -> dict | None:
        """A fresh copy of the captured meta (None before the first capture)."""
        return None if self._meta_json is None else json.loads(self._meta_json)

    @property
    def nbytes(self) -> int:
        return self._buf.numel()

    def _require(self) -> str:
        if self._meta_json is None:
            raise SnapshotError("snapshot has not been captured")
        return self._meta_json

    # -- serving a peer -----------------------------------------------------------------------
    @staticmethod
    def _hash(payload: torch.Tensor, meta_json: str) -> str:
        h = hashlib.sha256(_bytes_of(payload))
        h.update(b"\0" + meta_json.encode())
        return h.hexdigest()

    def digest(self) -> str:
        """sha256 over the buffer bytes and the canonical meta JSON; cached until the next
        capture."""
        meta_json = self._require()
        if self._digest is None:
            self._digest = self._hash(self._buf, meta_json)
        return self._digest

    def payload(self) -> torch.Tensor:
        """The flat uint8 buffer itself (no copy): broadcast it, or receive into it."""
        return self._buf

    @staticmethod
    def verify(payload: torch.Tensor, meta: dict, digest: str) -> None:
        """Raise :class:`SnapshotError` unless ``payload`` + ``meta`` hash to ``digest``."""
        if payload.dtype != torch.uint8 or payload.dim() != 1:
            raise SnapshotError(f"snapshot payload must be a flat uint8 tensor, got "
                                f"{payload.dtype} {list(payload.shape)}")
        got = Snapshot._hash(payload, _canonical(meta))
        if got != digest:
            raise SnapshotError(f"snapshot checksum mismatch at step {meta.get('step')}: "
                                f"got {got[:12]}, expected {str(digest)[:12]}")

    def receive(self, payload: torch.Tensor, meta: dict, digest: str) -> None:
        """Adopt a peer's snapshot: verify it, then copy it in (``payload`` may be this
        snapshot's own buffer, when it was received in place). On failure this snapshot is
        left uncaptured rather than holding unverified bytes under old meta."""
        if payload.numel() != self._buf.numel():
            raise SnapshotError(f"snapshot payload has {payload.numel()} bytes, this layout "
                                f"needs {self._buf.numel()}")
        if not isinstance(meta.get("step"), int):
            raise SnapshotError(f"snapshot meta needs an int 'step', got {meta.get('step')!r}")
        if payload.data_ptr() == self._buf.data_ptr():
            self._meta_json = self._step = self._digest = None
        self.verify(payload, meta, digest)
        if payload.data_ptr() != self._buf.data_ptr():
            self._buf.copy_(payload)
        self._meta_json, self._step, self._digest = _canonical(meta), meta["step"], digest

    def restore_into(self, tensors: Sequence[torch.Tensor]) -> dict:
        """Copy the snapshot back into ``tensors`` (in place); returns the meta."""
        self._require()
        self._check(tensors)
        with torch.no_grad():
            for t, v in zip(tensors, self._views):
                t.copy_(v)
        return self.meta  # type: ignore[return-value]

    # -- self-describing bytes ----------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """MAGIC | u32 header length | header JSON (layout, meta) | buffer | sha256(all before)."""
        header = json.dumps({"layout": [[list(s), d] for s, d in self._layout],
                             "nbytes": self._buf.numel(), "meta": json.loads(self._require())},
                            sort_keys=True, separators=(",", ":")).encode()
        body = b"".join([_MAGIC, struct.pack("<I", len(header)), header, _bytes_of(self._buf)])
        return body + hashlib.sha256(body).digest()

    @classmethod
    def from_bytes(cls, template: Sequence[torch.Tensor], b: bytes,
                   device: str | torch.device = "cpu") -> Snapshot:
        """Inverse of :meth:`to_bytes`; raises :class:`SnapshotError` on corruption,
        truncation, or a layout that differs from ``template``."""
        b = memoryview(b).cast("B")
        head = len(_MAGIC) + 4
        if len(b) < head + _SHA:
            raise SnapshotError(f"snapshot bytes truncated: {len(b)} bytes")
        if bytes(b[:len(_MAGIC)]) != _MAGIC:
            raise SnapshotError("snapshot bytes have a bad magic number (not a snapshot)")
        if hashlib.sha256(b[:-_SHA]).digest() != bytes(b[-_SHA:]):
            raise SnapshotError(f"snapshot bytes checksum mismatch ({len(b)} bytes; "
                                "corrupt or truncated)")
        (hlen,) = struct.unpack("<I", b[len(_MAGIC):head])
        try:
            header: dict[str, Any] = json.loads(bytes(b[head:head + hlen]))
            layout = [(tuple(s), str(_dtype(d))) for s, d in header["layout"]]
            meta, nbytes = header["meta"], int(header["nbytes"])
        except SnapshotError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"snapshot header is malformed: {exc}") from None
        snap = cls(template, device=device)
        if (why := _mismatch(snap._layout, layout)) is not None:
            raise SnapshotError(f"snapshot bytes do not match the template: {why}")
        data = b[head + hlen:-_SHA]
        if len(data) != nbytes or nbytes != snap.nbytes:
            raise SnapshotError(f"snapshot buffer has {len(data)} bytes, header says {nbytes}, "
                                f"layout needs {snap.nbytes}")
        if nbytes:
            snap._buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        snap._meta_json, snap._step = _canonical(meta), meta.get("step")
        return snap
