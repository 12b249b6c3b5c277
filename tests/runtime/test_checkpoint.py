"""Durable checkpoints: DCP write on a background thread, checksummed manifest, atomic rename."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from unbroken.runtime import checkpoint as ckpt  # noqa: E402
from unbroken.runtime.checkpoint import CheckpointError, CheckpointStore  # noqa: E402

pytestmark = [
    pytest.mark.timeout(60),
    # pytest resets warning filters per test; the module silences this one itself.
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def state(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, generator=g, dtype=torch.float64),
            torch.randn(3, generator=g, dtype=torch.float64),
            torch.randn(4, 3, generator=g, dtype=torch.float32),
            torch.tensor(7.0, dtype=torch.float32)]


def equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y)
                                    for x, y in zip(a, b))


@pytest.fixture
def logged() -> list[str]:
    return []


@pytest.fixture
def store(tmp_path, logged):
    s = CheckpointStore(tmp_path / "ckpt", keep=3, log=logged.append)
    yield s
    s._pool.shutdown(wait=True)


def save(store: CheckpointStore, step: int, seed: int | None = None) -> list[torch.Tensor]:
    ts = state(step if seed is None else seed)
    store.save_async(step, ts, {"step": step, "plan": {"depth": 1}})
    store.wait()
    return ts


def data_file(path: str) -> Path:
    (f,) = Path(path).glob("*.distcp")
    return f


def test_round_trip(store):
    ts = save(store, 3)
    step, path = store.latest()
    assert step == 3 and Path(path).name == "step-00000003"
    out, meta = store.load(state(99))
    assert equal(out, ts) and meta == {"step": 3, "plan": {"depth": 1}}
    assert sorted(p.name for p in Path(path).iterdir()) == [
        ".metadata", "__0_0.distcp", "manifest.json", "meta.json"]


def test_save_async_stages_before_returning(store, monkeypatch):
    # Hold the background write until the caller has mutated its tensors in place (as the
    # next optimizer step would): the checkpoint must still hold the pre-mutation values.
    release, writing = threading.Event(), threading.Event()
    real = ckpt._write_state

    def held(state, path):
        writing.set()
        assert release.wait(30)
        real(state, path)

    monkeypatch.setattr(ckpt, "_write_state", held)
    ts = state(1)
    before = [t.clone() for t in ts]
    fut = store.save_async(1, ts, {"step": 1})
    assert writing.wait(30) and not fut.done()  # returned while the write is pending
    for t in ts:
        t.add_(1.0)
    release.set()
    assert Path(fut.result(timeout=30)).name == "step-00000001"
    out, _ = store.load(state(0))
    assert equal(out, before)


def disk_full(state, path):
    raise OSError("disk full")


def test_background_error_is_reraised_by_wait(store, logged, monkeypatch):
    monkeypatch.setattr(ckpt, "_write_state", disk_full)
    store.save_async(4, state(), {"step": 4})
    with pytest.raises(OSError, match="disk full"):
        store.wait()
    assert any("step 4" in line and "disk full" in line for line in logged)
    assert store.latest() is None
    assert list(store.directory.iterdir()) == []  # the failed .tmp dir was removed


def test_on_saved_hears_of_a_checkpoint_once_it_is_in_place_and_never_of_a_failed_one(
        tmp_path, monkeypatch):
    # the runner journals these: the guard rolls back only to a checkpoint it heard of
    heard: list[tuple[int, str, bool]] = []
    s = CheckpointStore(tmp_path / "ckpt", on_saved=lambda step, path: heard.append(
        (step, path, Path(path).is_dir())))
    try:
        path = s.save_async(10, state(), {"step": 10}).result(timeout=30)
        assert heard == [(10, path, True)]  # before the future resolved, after the rename
        monkeypatch.setattr(ckpt, "_write_state", disk_full)
        s.save_async(20, state(), {"step": 20})
        with pytest.raises(OSError, match="disk full"):
            s.wait()
        assert len(heard) == 1
    finally:
        s._pool.shutdown(wait=True)


def test_flipped_byte_in_newest_falls_back_to_previous(store, logged):
    older = save(store, 1)
    save(store, 2)
    newest = store.directory / "step-00000002"
    f = data_file(newest)
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0x01
    f.write_bytes(bytes(b))

    assert store.latest() == (1, str(store.directory / "step-00000001"))
    (line,) = logged
    assert str(newest) in line and "sha256 mismatch for __0_0.distcp" in line
    out, _ = store.load(state(0))
    assert equal(out, older)


@pytest.mark.parametrize("damage", ["truncate", "no_manifest", "meta_edit", "manifest_edit"])
def test_other_damage_is_detected(store, logged, damage):
    save(store, 1)
    save(store, 2)
    newest = store.directory / "step-00000002"
    if damage == "truncate":
        f = data_file(newest)
        f.write_bytes(f.read_bytes()[:-5])
        reason = "__0_0.distcp has"
    elif damage == "no_manifest":
        (newest / "manifest.json").unlink()
        reason = "no manifest.json"
    elif damage == "meta_edit":
        (newest / "meta.json").write_text(json.dumps({"step": 3, "plan": {"depth": 1}}))
        reason = "meta.json"
    else:  # an edit the file hashes would not catch: the manifest's own checksum must
        doc = json.loads((newest / "manifest.json").read_text())
        doc["body"]["tensors"][0][0] = [5, 3]
        (newest / "manifest.json").write_text(json.dumps(doc))
        reason = "manifest.json checksum mismatch"
    assert store.latest()[0] == 1
    assert len(logged) == 1 and str(newest) in logged[0] and reason in logged[0]


def test_load_of_a_corrupt_path_raises(store):
    save(store, 1)
    path = store.directory / "step-00000001"
    f = data_file(path)
    b = bytearray(f.read_bytes())
    b[0] ^= 0x80
    f.write_bytes(bytes(b))
    with pytest.raises(CheckpointError, match=r"step-00000001 is corrupt: sha256 mismatch"):
        store.load(state(), path)
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        store.load(state())


def test_load_rejects_a_template_mismatch(store):
    save(store, 1)
    wrong = state()
    wrong[1] = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(CheckpointError, match=r"tensor 1 stored as \[\[3\], 'torch.float64'\]"):
        store.load(wrong)


def test_leftover_tmp_dir_is_ignored_and_cleaned(store, logged):
    save(store, 1)
    # A writer that crashed mid-save (pid 2**22+1 exceeds Linux's pid_max, so it is dead),
    # and one of this process left over from before (no save is in flight now).
    dead = store.directory / f"step-00000002.tmp-{2**22 + 1}"
    mine = store.directory / f"step-00000003.tmp-{os.getpid()}"
    for d in (dead, mine):
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"partial")
    assert store.latest() == (1, str(store.directory / "step-00000001"))
    assert not dead.exists() and not mine.exists() and logged == []


def test_keep_prunes_oldest(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(1, 6):
        store.save_async(step, state(step), {"step": step})
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]
    out, meta = store.load(state(0))
    assert equal(out, state(5)) and meta == {"step": 5}


def test_saving_a_step_again_replaces_it(store):
    save(store, 2, seed=10)
    again = save(store, 2, seed=11)
    assert [p.name for p in store.directory.iterdir()] == ["step-00000002"]
    assert equal(store.load(state(0))[0], again)


def test_meta_must_be_json(store):
    with pytest.raises(CheckpointError, match="JSON"):
        store.save_async(1, state(), {"step": 1, "x": object()})
