"""Durable checkpoints of the training state: written in the background, checksummed, atomic.

The in-memory :mod:`~unbroken.runtime.snapshot` covers the loss of some groups; this covers
the loss of all of them (or of every copy of a snapshot). A checkpoint is a directory::

    <directory>/step-00000123/
        .metadata, __0_0.distcp   torch.distributed.checkpoint (DCP) output: the state by name
                                  ("model.<param>", "optim.<param>.<buffer>"), or "t0", "t1",
                                  ... for a trainer that lists its state without names
        meta.json                 the caller's meta (JSON)
        manifest.json             sha256 + size of every file above, the tensor layout, the
                                  step, and a sha256 of the manifest body itself

How it is written
-----------------
:meth:`CheckpointStore.save_async` first *stages* a copy of the tensors on the caller's
thread (a memcpy into reused host buffers), so in-place updates made by the next optimizer
step cannot leak into the checkpoint, then returns a :class:`concurrent.futures.Future`. One
background thread then runs ``dcp.save(state, storage_writer=FileSystemWriter(tmp,
sync_files=True), no_dist=True)`` into ``step-00000123.tmp-<pid>/``, writes ``meta.json`` and
``manifest.json``, fsyncs them and the directory, and ``os.rename``\\ s it to
``step-00000123/``: the rename is the commit point, so a crash leaves at most a ``.tmp-``
directory, which :meth:`CheckpointStore.latest` ignores and removes once its writer is gone
(judged by pid on this host: with a directory shared across hosts, give each host its own).
The newest ``keep`` checkpoints are kept.

Why ``dcp.save`` on our own thread rather than ``dcp.async_save``: on torch 2.13 CPU
``dcp.async_save(..., no_dist=True)`` does work without a process group, but it starts a new
one-thread pool per call (two saves could then overlap) and it only covers the DCP write:
the manifest, fsync and rename must run after it anyway. A single worker thread of ours
orders all of that, and staging is ours too so the staging buffers can be reused.
``no_dist=True`` keeps DCP off any process group (each group's state is a full replica, so
a save needs no coordination), also when ``torch.distributed`` is initialised.

A group of several ranks (its model sharded by FSDP2 or tensor parallelism) saves together:
every rank passes its DTensors and the group's checkpoint process group, DCP writes each
rank's shards with their place in the whole tensor (``__<rank>_0.distcp``) and rank 0 (the
*coordinator*) writes the metadata, the manifest and makes the rename. Because the state is
named and DCP records each shard's place, a checkpoint loads into any layout: a group of two
ranks' into one rank, or into groups of two again at another number of groups.

Back-pressure: at most one save is in flight. A ``save_async`` issued while the previous one
is still writing blocks until it finishes, so host memory stays bounded at one staged copy.

How it is read
--------------
:meth:`CheckpointStore.latest` returns the newest checkpoint whose manifest verifies (every
file's size and sha256); a corrupt one (a flipped byte, a truncated file, a missing
manifest) is skipped with one warning line naming the directory and the reason, and the
previous one is used. :meth:`CheckpointStore.load` verifies before it reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from unbroken.fsio import fsync_dir, sha256_file, write_synced

__all__ = ["CheckpointError", "CheckpointStore"]

# no_dist=True is deliberate (see the module docstring); DCP warns about it on every call.
warnings.filterwarnings("ignore", category=UserWarning,
                        message=r"torch\.distributed is disabled, unavailable or uninitialized")

_FORMAT = 1
_MANIFEST = "manifest.json"
_META = "meta.json"
_STEP_RE = re.compile(r"^step-(\d{8,})$")
_DEBRIS_RE = re.compile(r"^step-\d{8,}\.(?:tmp|old)-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (corrupt, incomplete, wrong layout, none found)."""


class _Corrupt(Exception):
    """Why a checkpoint directory failed verification (one line)."""


def _canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _layout(tensors: Sequence[torch.Tensor] | Mapping[str, torch.Tensor]) -> list | dict:
    """Every tensor's (whole) shape and dtype: a list for listed state, by name for named."""
    if isinstance(tensors, Mapping):
        return {k: [list(t.shape), str(t.dtype)] for k, t in tensors.items()}
    return [[list(t.shape), str(t.dtype)] for t in tensors]


def _keyed(state: Sequence[torch.Tensor] | Mapping[str, torch.Tensor]) -> dict:
    return dict(state) if isinstance(state, Mapping) else {f"t{i}": t for i, t in enumerate(state)}


def _write_state(state: dict[str, torch.Tensor], path: Path, group: Any = None) -> None:
    """The DCP write (a module-level seam so tests can hold a save mid-flight); ``group``: the
    process group of ranks that save together (None: this process alone)."""
    dcp.save(state, storage_writer=FileSystemWriter(path, sync_files=True),
             process_group=group, no_dist=group is None)


def _like(t: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as ``t`` is: the same DTensor placement when ``t`` is a DTensor."""
    if not hasattr(t, "_local_tensor"):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, t.device_mesh, t.placements, shape=t.shape,
                              stride=t.stride(), run_check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _verify(path: Path) -> dict:
    """The manifest body of a complete, intact checkpoint; raises :class:`_Corrupt`."""
    try:
        raw = (path / _MANIFEST).read_bytes()
    except FileNotFoundError:
        raise _Corrupt(f"no {_MANIFEST}") from None
    try:
        doc = json.loads(raw)
        body, digest = doc["body"], doc["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise _Corrupt(f"{_MANIFEST} unreadable ({type(exc).__name__})") from None
    if hashlib.sha256(_canonical(body).encode()).hexdigest() != digest:
        raise _Corrupt(f"{_MANIFEST} checksum mismatch")
    m = _STEP_RE.match(path.name)
    if m and int(m.group(1)) != body.get("step"):
        raise _Corrupt(f"manifest step {body.get('step')} != directory step {int(m.group(1))}")
    files = body.get("files", {})
    for required in (".metadata", _META):
        if required not in files:
            raise _Corrupt(f"manifest does not list {required}")
    for name, want in sorted(files.items()):
        f = path / name
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            raise _Corrupt(f"missing file {name}") from None
        if size != want["size"]:
            raise _Corrupt(f"{name} has {size} bytes, manifest says {want['size']}")
        if sha256_file(f) != want["sha256"]:
            raise _Corrupt(f"sha256 mismatch for {name}")
    return body


class CheckpointStore:
    """Durable checkpoints under ``directory`` (see the module docstring).

    ``log`` receives one-line warnings (a rejected checkpoint, a failed background save);
    it defaults to this module's :mod:`logging` logger. ``on_saved(step, path)`` is called
    on the writer thread once a save is renamed into place (by the coordinator only), before
    its future resolves.
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3,
                 log: Callable[[str], None] | None = None,
                 on_saved: Callable[[int, str], None] | None = None):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._log = log or logging.getLogger(__name__).warning
        self._on_saved = on_saved
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-writer")
        self._pending: list[Future] = []
        self._inflight: Future | None = None
        self._staged: list[torch.Tensor] | None = None
        self._fs_lock = threading.Lock()  # pruning vs. scanning the directory

    # -- writing ------------------------------------------------------------------------------
    def save_async(self, step: int, tensors: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
                   meta: dict, *, group: Any = None, coordinator: bool = True,
                   tag: int | None = None) -> Future:
        """Stage a copy of ``tensors`` (a list, or the state by name) now, write it in the
        background. The returned future resolves to the checkpoint's path; its error (if any)
        is also raised by :meth:`wait`. Blocks only while a previous save is still writing.

        A group of ranks saving together: every rank calls it with the group's ``group``
        (a process group of their own: the save runs on a background thread), the same
        ``tag`` (the coordinator's pid, naming the shared temporary directory) and
        ``coordinator`` True on rank 0 only."""
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        try:
            meta_json = _canonical(meta)  # fail in the caller, not in the background
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint meta is not JSON-able: {exc}") from None
        if self._inflight is not None:
            wait_futures([self._inflight])  # back-pressure; its error stays for wait()
        self._pending = [f for f in self._pending if not f.done() or f.exception()]
        staged = self._stage(tensors)
        fut = self._pool.submit(self._write, step, staged, meta_json, group, coordinator,
                                os.getpid() if tag is None else tag)
        self._inflight = fut
        self._pending.append(fut)
        return fut

    def _stage(self, tensors: Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
               ) -> list[torch.Tensor] | dict[str, torch.Tensor]:
        # The writer of the previous save is done (back-pressure), so its buffers are free.
        keyed = _keyed(tensors)
        local = {k: (t._local_tensor if hasattr(t, "_local_tensor") else t)
                 for k, t in keyed.items()}
        if self._staged is None or _layout(self._staged) != _layout(local):
            self._staged = {k: torch.empty(t.shape, dtype=t.dtype) for k, t in local.items()}
        with torch.no_grad():
            for k, t in local.items():
                self._staged[k].copy_(t)
        staged = {k: _like(keyed[k], self._staged[k]) for k in keyed}
        return staged if isinstance(tensors, Mapping) else list(staged.values())

    def _write(self, step: int, staged: list[torch.Tensor] | dict[str, torch.Tensor],
               meta_json: str, group: Any = None, coordinator: bool = True,
               tag: int | None = None) -> str:
        name = f"step-{step:08d}"
        final = self.directory / name
        tmp = self.directory / f"{name}.tmp-{os.getpid() if tag is None else tag}"
        try:
            if coordinator:
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir()
            if group is not None:  # the others write into the directory the coordinator made
                import torch.distributed as dist

                dist.barrier(group=group)
            if group is None:
                _write_state(_keyed(staged), tmp)
            else:
                _write_state(_keyed(staged), tmp, group)
            if not coordinator:
                return str(final)
            write_synced(tmp / _META, meta_json)
            files = {}
            for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
                files[f.relative_to(tmp).as_posix()] = {"sha256": sha256_file(f),
                                                        "size": f.stat().st_size}
            body = {"format": _FORMAT, "step": step, "tensors": _layout(staged),
                    "files": files}
            manifest = {"body": body,
                        "sha256": hashlib.sha256(_canonical(body).encode()).hexdigest()}
            write_synced(tmp / _MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
            fsync_dir(tmp)
            with self._fs_lock:
                old = None
                if final.exists():  # the same step saved again: newest wins
                    old = self.directory / f"{name}.old-{os.getpid()}"
                    if old.exists():
                        shutil.rmtree(old)
                    os.rename(final, old)
                os.rename(tmp, final)
                fsync_dir(self.directory)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
                self._prune()
        except BaseException as exc:
            if coordinator:
                shutil.rmtree(tmp, ignore_errors=True)
            self._log(f"checkpoint save of step {step} to {final} failed: "
                      f"{type(exc).__name__}: {exc}")
            raise
        if self._on_saved is not None:  # outside the try: the checkpoint is in place
            self._on_saved(step, str(final))
        return str(final)

    def _prune(self) -> None:
        steps = sorted(self._complete(), reverse=True)
        for _, path in steps[self.keep:]:
            shutil.rmtree(path, ignore_errors=True)

    def wait(self) -> None:
        """Wait for every pending save; re-raise the first error among them."""
        pending, self._pending = self._pending, []
        wait_futures(pending)
        for f in pending:
            if f.exception() is not None:
                raise f.exception()  # type: ignore[misc]

    def close(self) -> None:
        """Wait for pending saves (re-raising their errors) and stop the writer thread."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    # -- reading ------------------------------------------------------------------------------
    def _complete(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.directory.iterdir():
            m = _STEP_RE.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
        return out

    def _clean_debris(self) -> None:
        """Remove ``.tmp-``/``.old-`` directories whose writer is gone (a crash mid-save)."""
        busy = self._inflight is not None and not self._inflight.done()
        for p in self.directory.iterdir():
            m = _DEBRIS_RE.match(p.name)
            if not m:
                continue
            pid = int(m.group(1))
            if (pid == os.getpid() and not busy) or (pid != os.getpid() and not _pid_alive(pid)):
                shutil.rmtree(p, ignore_errors=True)

    def latest(self) -> tuple[int, str] | None:
        """``(step, path)`` of the newest checkpoint that verifies, or None. Corrupt or
        incomplete ones are skipped with one warning line each."""
        with self._fs_lock:
            self._clean_debris()
            for step, path in sorted(self._complete(), reverse=True):
                try:
                    _verify(path)
                except _Corrupt as why:
                    self._log(f"checkpoint {path} rejected: {why}; trying the previous one")
                    continue
                return step, str(path)
        return None

    def load(self, template: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
             path: str | os.PathLike | None = None, group: Any = None
             ) -> tuple[list[torch.Tensor] | dict[str, torch.Tensor], dict]:
        """Verify, then read a checkpoint (``path``, or :meth:`latest`) into fresh tensors
        shaped like ``template`` (same dtypes and devices; the state by name: DTensors are
        filled with this rank's shards, whatever layout wrote them, every rank of ``group``
        reading together). Returns ``(tensors, meta)``; raises :class:`CheckpointError`
        (one line) if it is corrupt or does not match."""
        if path is None:
            found = self.latest()
            if found is None:
                raise CheckpointError(f"no valid checkpoint in {self.directory}")
            path = found[1]
        path = Path(path)
        try:
            body = _verify(path)
        except _Corrupt as why:
            raise CheckpointError(f"checkpoint {path} is corrupt: {why}") from None
        want, got = body["tensors"], _layout(template)
        if want != got:
            if isinstance(want, dict) != isinstance(got, dict):
                why = ("stored by name" if isinstance(want, dict) else "stored as a list") + \
                    ", the template is not"
            elif isinstance(want, dict):
                k = sorted(set(want) ^ set(got)) or [k for k in want if want[k] != got[k]]
                why = (f"{k[0]} stored as {want.get(k[0])}, template has {got.get(k[0])}")
            elif len(want) != len(got):
                why = f"{len(want)} tensors stored, template has {len(got)}"
            else:
                i = next(i for i, (w, g) in enumerate(zip(want, got)) if w != g)
                why = f"tensor {i} stored as {want[i]}, template has {got[i]}"
            raise CheckpointError(f"checkpoint {path} does not match the template: {why}")
        keyed = {k: torch.empty_like(t) for k, t in _keyed(template).items()}
        try:
            dcp.load(keyed, storage_reader=FileSystemReader(path), process_group=group,
                     no_dist=group is None)
        except Exception as exc:  # verified bytes that DCP still cannot read
            line = str(exc).splitlines()[0] if str(exc) else ""
            raise CheckpointError(f"checkpoint {path} unreadable: {type(exc).__name__}: "
                                  f"{line}") from exc
        out = keyed if isinstance(template, Mapping) else list(keyed.values())
        return out, json.loads((path / _META).read_text(encoding="utf-8"))
