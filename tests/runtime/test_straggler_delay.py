"""Straggler traces as real delays inside real worker processes (4 gloo groups): a
``persistent:1@3`` group really spends ~3x the others' time on its own part of each step, the
journal carries every group's resource signals, and the slowdown changes timing only: the
parameters are bit for bit those of the run without it. Synchronisation: store keys and
process exits only."""

from __future__ import annotations

import statistics

import pytest

pytest.importorskip("torch")

from helpers import events  # noqa: E402

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

pytestmark = [pytest.mark.mp, pytest.mark.timing]

# a gradient of a few ms, so a 3x slowdown is tens of ms: well above the timer's and the
# scheduler's noise on a loaded 2-core machine
CFG = TrainConfig(groups=4, redundancy=2, steps=24, seed=5, shard_size=256,
                  trainer_args={"hidden": 256, "dim": 64, "dataset_size": 4096})


def _run(cfg: TrainConfig, tmp) -> tuple[dict[int, list], dict[int, list[dict]]]:
    uids = list(range(cfg.groups))
    tmp.mkdir()
    with StackedCluster(cfg, str(tmp)) as c:
        done = {u: c.wait_key(f"done/{u}", 60, alive=uids) for u in uids}
        for u in uids:
            assert c.procs[u].wait(timeout=30) == 0, c.stderr(u)[-2000:]
        return {u: done[u]["params"] for u in uids}, {u: c.journal(u) for u in uids}


@pytest.mark.timeout(90)
def test_persistent_straggler_is_3x_slower_and_changes_nothing_but_time(tmp_path):
    plain_params, plain = _run(CFG, tmp_path / "plain")
    from dataclasses import replace

    slow_params, slow = _run(replace(CFG, stragglers="persistent:1@3"), tmp_path / "slow")
    # timing only: the same parameters, bit for bit, in every group
    assert slow_params == plain_params
    own = {u: [e["own_s"] for e in events(slow[u], "commit")[1:]] for u in slow}  # step 0:
    #                                                                    warm-up, left out
    # the fastest step of each group: scheduling noise (the other groups and agents on 2
    # cores) only ever adds time, and a preempted compute is scaled by 3 too, so the medians
    # wander with the machine's load while the minima show the injected ratio. The fast
    # groups compute the same: the lowest of their minima is the best look at that compute
    # (a loaded fresh clone's run had minima 2.03, 2.24, 2.73 ms, and against their median
    # the straggler's 5.58 read 2.50x, twice)
    fast = min(min(own[u]) for u in (0, 2, 3))
    ratio = min(own[1]) / fast
    # 3x (not applied gives 1x, applied twice 9x). The bound above is loose: the injected
    # delay is a sleep, and on a loaded machine (a suite run beside other work: load 17 on two
    # cores) each wake-up comes late, which only the straggler pays (measured 4.6x there)
    assert 2.5 < ratio < 6.0, (ratio, {u: min(v) for u, v in own.items()})
    # without the trace the same group is not the slow one
    base = {u: statistics.median(e["own_s"] for e in events(plain[u], "commit")[1:])
            for u in plain}
    assert base[1] < 1.6 * statistics.median(base[u] for u in (0, 2, 3)), base
    # every commit carries the resource signals; the straggler's CPU availability reads ~1/3
    # of the others' (it sleeps 2/3 of its part: a busy-wait would read like the others)
    for u, evs in slow.items():
        for e in events(evs, "commit"):
            assert e["own_s"] > 0 and 0 < e["cpu"] <= 1.05
            # bytes sent are measured, received modelled (the ring's 2(m-1)/m x the buffer):
            # for a ring they agree, up to the journal line written between two samples
            assert 0 < e["rx_bytes"] <= e["tx_bytes"] < e["rx_bytes"] + 10_000, e
    cpu = {u: statistics.median(e["cpu"] for e in events(slow[u], "commit")) for u in slow}
    # sleeping 2/3 of its part, the straggler cannot read above ~1/3 whatever the load; the
    # others read their share of a loaded machine, which may itself be ~0.5 (CI saw {0: 0.64,
    # 2: 0.85, 3: 0.50} beside the straggler's 0.33, and {0: 0.48, 2: 0.45, 3: 0.72} beside
    # 0.30 with the pure tests on the other core), so against their median the margin is
    # smaller than against an idle machine's. A busy-wait would read like the others
    assert cpu[1] < 0.4 and cpu[1] < 0.7 * statistics.median(cpu[u] for u in (0, 2, 3)), cpu
