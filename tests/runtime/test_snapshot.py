"""In-memory snapshot: a bitwise memcpy of the committed state, checksummed when served."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from unbroken.runtime.snapshot import Snapshot, SnapshotError  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def state(seed: int = 0) -> list[torch.Tensor]:
    # Mixed dtypes and odd sizes on purpose: slices must stay aligned and not overlap.
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 5, generator=g, dtype=torch.float64),
            torch.randn(7, generator=g, dtype=torch.float32),
            torch.tensor(12.0, dtype=torch.float32),          # e.g. Adam's step counter
            torch.randint(0, 100, (2, 2), generator=g),       # int64
            torch.zeros(0, dtype=torch.float64),              # empty tensor
            torch.tensor([True, False, True])]


def zeros_like(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros_like(t) for t in ts]


def bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape
        and x.reshape(-1).view(torch.uint8).equal(y.reshape(-1).view(torch.uint8))
        for x, y in zip(a, b))


def captured(seed: int = 0, step: int = 5) -> tuple[Snapshot, list[torch.Tensor]]:
    src = state(seed)
    snap = Snapshot(src)
    snap.capture(src, {"step": step, "plan": {"depth": 1, "assignment": [0, 1]}})
    return snap, src


def test_round_trip_is_bitwise():
    src = state()
    src[0][0, 0] = -0.0  # a signed zero compares equal to 0.0 but not bitwise
    snap = Snapshot(src)
    assert not snap.captured
    snap.capture(src, {"step": 5, "plan": [1, 2]})
    out = zeros_like(src)
    meta = snap.restore_into(out)
    assert bitwise_equal(out, src)
    assert meta == {"step": 5, "plan": [1, 2]} and snap.step == 5 and snap.captured


def test_capture_does_not_alias_the_source():
    snap, src = captured()
    expected = [t.clone() for t in src]
    for t in src:
        t.zero_() if t.dtype != torch.bool else t.logical_not_()
    out = zeros_like(src)
    snap.restore_into(out)
    assert bitwise_equal(out, expected)


def test_meta_is_a_copy():
    src = state()
    meta = {"step": 1, "plan": [0]}
    snap = Snapshot(src)
    snap.capture(src, meta)
    meta["plan"].append(9)
    snap.meta["plan"].append(8)
    assert snap.meta == {"step": 1, "plan": [0]}


def test_capture_reuses_one_buffer():
    # The cost bar: capture must write into the preallocated buffer, never allocate one.
    snap, src = captured()
    buf = snap.payload()
    ptr = buf.data_ptr()
    snap.capture(state(1), {"step": 6})
    assert snap.payload().data_ptr() == ptr
    out = zeros_like(src)
    snap.restore_into(out)
    assert bitwise_equal(out, state(1)) and snap.step == 6


def test_digest_is_cached_and_changes_with_bytes_and_meta():
    snap, src = captured()
    d0 = snap.digest()
    assert snap.digest() == d0
    snap.capture(src, {"step": 5, "plan": {"depth": 1, "assignment": [0, 1]}})
    assert snap.digest() == d0  # same state and meta -> same digest (deterministic padding)

    src[1][3] = torch.nextafter(src[1][3], torch.tensor(float("inf")))  # one ulp
    snap.capture(src, {"step": 5, "plan": {"depth": 1, "assignment": [0, 1]}})
    d1 = snap.digest()
    assert d1 != d0

    snap.capture(src, {"step": 5, "plan": {"depth": 2, "assignment": [0, 1]}})
    assert snap.digest() != d1


def test_same_state_on_two_peers_has_the_same_digest():
    a, _ = captured(seed=3)
    b, _ = captured(seed=3)
    assert a.digest() == b.digest()


def test_verify_accepts_intact_and_rejects_flipped_element():
    snap, _ = captured()
    sent = snap.payload().clone()  # what a peer receives over the collective
    Snapshot.verify(sent, snap.meta, snap.digest())

    sent[0] ^= 0x01
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        Snapshot.verify(sent, snap.meta, snap.digest())

    with pytest.raises(SnapshotError, match="checksum mismatch"):
        Snapshot.verify(snap.payload(), {**snap.meta, "step": 6}, snap.digest())


def test_receive_into_own_buffer_then_restore():
    # A replacement process preallocates its snapshot, receives the broadcast in place,
    # verifies and restores.
    sender, src = captured(seed=2, step=9)
    receiver = Snapshot(state())
    receiver.payload().copy_(sender.payload())
    receiver.receive(receiver.payload(), sender.meta, sender.digest())
    out = zeros_like(src)
    assert receiver.restore_into(out)["step"] == 9
    assert bitwise_equal(out, src)


def test_receive_of_corrupt_payload_leaves_no_usable_snapshot():
    sender, _ = captured()
    receiver = Snapshot(state())
    receiver.payload().copy_(sender.payload())
    receiver.payload()[-1] ^= 0xFF
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        receiver.receive(receiver.payload(), sender.meta, sender.digest())
    assert not receiver.captured
    with pytest.raises(SnapshotError, match="not been captured"):
        receiver.restore_into(zeros_like(state()))


def test_bytes_round_trip():
    snap, src = captured(seed=4, step=11)
    back = Snapshot.from_bytes(state(), snap.to_bytes())
    out = zeros_like(src)
    assert back.restore_into(out) == snap.meta
    assert bitwise_equal(out, src) and back.digest() == snap.digest()


@pytest.mark.parametrize("where", [0, 20, "middle", -1])
def test_from_bytes_rejects_a_flipped_byte(where):
    snap, _ = captured()
    b = bytearray(snap.to_bytes())
    i = len(b) // 2 if where == "middle" else where
    b[i] ^= 0x10
    with pytest.raises(SnapshotError):
        Snapshot.from_bytes(state(), bytes(b))


@pytest.mark.parametrize("keep", [0, 10, -1, -33])
def test_from_bytes_rejects_truncation(keep):
    snap, _ = captured()
    b = snap.to_bytes()
    with pytest.raises(SnapshotError, match="truncated|checksum mismatch"):
        Snapshot.from_bytes(state(), b[:keep])


def test_template_mismatch_names_the_tensor():
    snap, src = captured()
    wrong = list(src)
    wrong[1] = torch.zeros(8, dtype=torch.float32)
    with pytest.raises(SnapshotError, match=r"tensor 1: shape \[8\] != expected \[7\]"):
        snap.capture(wrong, {"step": 6})
    with pytest.raises(SnapshotError, match=r"tensor 1: shape \[8\]"):
        snap.restore_into(wrong)
    with pytest.raises(SnapshotError, match=r"tensor 1: shape \[7\] != expected \[8\]"):
        Snapshot.from_bytes(wrong, snap.to_bytes())  # stored [7], template [8]
    with pytest.raises(SnapshotError, match="expected 6 tensors, got 5"):
        snap.restore_into(src[:5])
    wrong[1] = torch.zeros(7, dtype=torch.float64)
    with pytest.raises(SnapshotError, match=r"tensor 1: dtype torch.float64 != expected "
                                            r"torch.float32"):
        snap.capture(wrong, {"step": 6})
    # A rejected capture must not have touched the snapshot.
    assert snap.step == 5


def test_meta_must_carry_a_step_and_be_json():
    snap, src = captured()
    with pytest.raises(SnapshotError, match="'step'"):
        snap.capture(src, {"plan": 1})
    with pytest.raises(SnapshotError, match="JSON"):
        snap.capture(src, {"step": 1, "x": object()})
