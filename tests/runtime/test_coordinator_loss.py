"""The coordinator (the process hosting the store) dies in the middle of training.

Contract (README, "Coordinator failure"): the job does not die silently and does not hang.
Every member finishes the step in flight, all of them stop after the *same* committed step,
rank 0 writes a durable checkpoint of it, and every worker exits with code 5. A new run with
``--resume`` continues from that checkpoint; the samples stay exactly-once across the two runs
and the parameters equal a failure-free run.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from helpers import committed_steps, events, finish, wait_while_alive  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.trainer import reference_run  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

pytestmark = pytest.mark.mp

# long enough that the coordinator is killed mid-run however late the kill lands (a
# busy CI machine let a 40-step job finish before the kill: every worker exited 0)
CFG = TrainConfig(groups=4, redundancy=2, steps=400, seed=7)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("corrupt_latest", [False, True])
def test_coordinator_death_stops_all_at_one_step_with_a_checkpoint_then_resume(
        tmp_path, corrupt_latest):
    jdir, cdir = tmp_path / "journal", tmp_path / "ckpt"
    jdir.mkdir()
    host = subprocess.Popen([sys.executable, "-m", "unbroken.runtime.store_host"],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(host.stdout.readline())
        # no member fails here: a staleness well above the 0.3 s default, so a loaded
        # machine that starves a member for a moment does not get it left out (exit 9)
        with StackedCluster(CFG, str(jdir), store_port=port, ckpt_dir=str(cdir),
                            ckpt_every=5, staleness=1.5) as c:
            # let it train a while (journal lines, waiting on a worker's exit between looks)
            wait_while_alive(lambda: min(len(committed_steps(jdir / f"group-{u}.jsonl"))
                                         for u in range(4)) >= 8,
                             [c.procs[u] for u in range(4)], timeout=120)
            host.send_signal(signal.SIGKILL)  # the coordinator dies
            host.wait(timeout=10)
            rcs = [c.procs[u].wait(timeout=60) for u in range(4)]
            assert rcs == [5, 5, 5, 5], [c.stderr(u)[-1500:] for u in range(4)]
            journals = {u: c.journal(u) for u in range(4)}
    finally:
        host.kill()
    last = {u: committed_steps(jdir / f"group-{u}.jsonl")[-1] for u in range(4)}
    assert len(set(last.values())) == 1, last  # all stopped after the same step
    stop = last[0]
    assert 8 <= stop < CFG.steps - 1
    lost = [e for u in range(4) for e in journals[u] if e["event"] == "coordinator_lost"]
    assert len(lost) == 4 and {e["step"] for e in lost} == {stop + 1}
    written = [e["checkpoint"] for e in lost if e["checkpoint"]]
    assert len(written) == 1 and written[0].endswith(f"step-{stop + 1:08d}")

    resume_at = stop + 1
    if corrupt_latest:  # a flipped byte in its data: detected, the previous one is used
        data = sorted((cdir / f"step-{stop + 1:08d}").glob("*.distcp"))[0]
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
        resume_at = max(k for k in range(5, stop + 1, 5))  # the last periodic checkpoint

    # resume with a new coordinator: continues from the checkpoint, exactly once, same result
    with StackedCluster(CFG, str(jdir), ckpt_dir=str(cdir), resume=True) as c:
        journals = finish(c, CFG, [0, 1, 2, 3], reference_run(CFG), tol=1e-9, wait_s=120)
    for u in range(4):
        assert [e["step"] for e in events(journals[u], "restore")] == [resume_at]
        warned = [e["message"] for e in events(journals[u], "checkpoint_warning")]
        assert bool(warned) == corrupt_latest and all(f"step-{stop + 1:08d}" in w
                                                      for w in warned), warned
