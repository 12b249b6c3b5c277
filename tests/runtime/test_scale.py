"""Recovery at 16 and 32 groups, with another CPU-bound process sharing the two cores.

At 16 groups a busy loop beside the run once exposed protocol bugs that a quiet box hides (two
members in different first collectives of a generation: a gloo "collective mismatch"; a joiner
whose state copy broke). So these runs carry the load themselves: a ``while True: pass``
process for the whole test. Each kills a group (death notice posted), admits a warm spare to
its slot with the state copied from one old member, and at 16 groups also hangs a group
(SIGSTOP, found by heartbeat): every step committed, every sample exactly once, parameters
equal to the failure-free single-process run.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

from helpers import events, finish, kill_and_notify  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402
from unbroken.runtime.trainer import reference_run  # noqa: E402

pytestmark = pytest.mark.mp


@pytest.fixture
def busy_loop():
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield p
    p.kill()
    p.wait(timeout=10)


def run_at(n: int, steps: int, tmp_path, *, hang_at: int | None = None,
           staleness: float = 0.3) -> dict:
    cfg = TrainConfig(groups=n, redundancy=2, steps=steps, seed=7)
    ref = reference_run(cfg)
    victim, hung, spare = 1, 3, n
    stop_at = {hung: hang_at} if hang_at is not None else None
    with StackedCluster(cfg, str(tmp_path), die_at={victim: 6}, stop_at=stop_at,
                        spares=1, staleness=staleness) as c:
        alive = [u for u in range(n) if u != victim]
        kill_and_notify(c, [victim], alive)
        c.assign(spare, victim)
        finishers = [u for u in alive if u != hung or hang_at is None] + [spare]
        j = finish(c, cfg, finishers, ref, wait_s=240)
    return j


@pytest.mark.timeout(420)
def test_16_groups_under_load_mask_a_kill_and_a_hang_and_admit_a_spare(busy_loop, tmp_path):
    j = run_at(16, 30, tmp_path, hang_at=22)
    (joined,) = events(j[16], "joined")
    assert joined["slot"] == 1
    commits = events(j[0], "commit")
    c22 = next(e for e in commits if e["step"] == 22)
    assert 3 not in c22["members"]  # the hung group is out at the step it hung in
    # the spare is in from its admission on (which step that is depends on the load: its
    # start-up competes with the training for the two cores)
    assert all(16 in e["members"] for e in commits if e["step"] >= joined["step"])
    assert all(3 not in e["members"] for e in commits if e["step"] >= 22)
    assert commits[-1]["step"] == 29


@pytest.mark.timeout(420)
def test_32_groups_under_load_mask_a_kill_and_admit_a_spare(busy_loop, tmp_path):
    # 33 processes and the busy loop on 2 cores: a CI run saw the admitted spare's heartbeat
    # thread go 0.98 s without a beat while the others beat, judged silent at 0.3 s and
    # re-formed without (correct: the launcher then sends another spare, which this harness
    # does not). The kill is found by its death notice, not by staleness: 1 s tests the
    # admission, not the heartbeat's sensitivity (the 16-group run's hang does that)
    j = run_at(32, 16, tmp_path, staleness=1.0)
    (adm,) = events(j[0], "admit")
    assert adm["joined"] == {"32": 1}
    assert events(j[32], "joined")[0]["slot"] == 1
