"""FTComm.send, the point-to-point state copy, on real gloo processes.

Three members (spawned interpreters; the test hosts the store): rank 0 sends to rank 2 only, so
rank 1 (a bystander) never touches its tensor; the same group then all-reduces (p2p and
collectives mix on one group). When the source is SIGKILLed before it sends, the receiver's
``send`` returns False (the generation broke) instead of waiting in gloo.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from unbroken.runtime.ftcomm import declare_dead  # noqa: E402

pytestmark = pytest.mark.mp

N = 3


def member(uid: int, port: int, die_before_send: bool, out) -> None:
    from unbroken.runtime.ftcomm import FTComm

    torch.set_num_threads(1)
    comm = FTComm(uid, list(range(N)), host="127.0.0.1", port=port, staleness=2.0)
    try:
        x = torch.full((1000,), float("nan"), dtype=torch.float64)
        if uid == 0:
            if die_before_send:
                os.kill(os.getpid(), signal.SIGKILL)
            x = torch.arange(1000, dtype=torch.float64)
        ok = comm.send(x, 0, [2])
        rec = {"uid": uid, "ok": ok, "nan": int(torch.isnan(x).sum()), "x1": float(x[1])}
        if ok and not die_before_send:
            y = torch.ones(4, dtype=torch.float64)
            rec["allreduce"] = comm.allreduce(y) and float(y[0])
        out.put(rec)
        out.close()
        out.join_thread()  # flushed before os._exit
    finally:
        comm.close()
        os._exit(0)


def run(die_before_send: bool, timeout: float = 60.0) -> dict[int, dict]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    port = store.port
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=member, args=(u, port, die_before_send, out), daemon=True)
             for u in range(N)]
    for p in procs:
        p.start()
    want = N - 1 if die_before_send else N
    got: dict[int, dict] = {}
    try:
        if die_before_send:  # the launcher's death notice, as the supervisor posts it
            procs[0].join(timeout)
            declare_dead(store, 0)
        while len(got) < want:
            rec = out.get(timeout=timeout)
            got[rec["uid"]] = rec
    except queue.Empty:
        pytest.fail(f"only {sorted(got)} of {want} members answered within {timeout}s")
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    del store
    return got


@pytest.mark.timeout(120)
def test_send_reaches_only_the_named_ranks_and_the_group_goes_on():
    got = run(die_before_send=False)
    assert got[2]["ok"] and got[2]["nan"] == 0 and got[2]["x1"] == 1.0  # received in place
    assert got[1]["ok"] and got[1]["nan"] == 1000  # the bystander's tensor untouched
    assert got[0]["ok"] and got[0]["x1"] == 1.0
    assert [got[u]["allreduce"] for u in range(N)] == [3.0, 3.0, 3.0]


@pytest.mark.timeout(120)
def test_receiver_whose_source_died_gets_false_not_a_hang():
    got = run(die_before_send=True)
    assert got[2]["ok"] is False and got[2]["nan"] == 1000
    assert got[1]["ok"] is True  # a bystander is not part of the op
