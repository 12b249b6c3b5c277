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
    # a group's CPU time for its own part of a step: own_s x cpu (the thread's CPU clock).
    # Every group does the same work, and CPU time does not grow while a process waits for a
    # core, so it is the load-free measure of that work. Wall times are not: beside a busy
    # loop the straggler, asleep 2/3 of the time, gets the core at once when it wakes (the
    # scheduler favours sleepers) while the others' compute is preempted, and wall against
    # wall read 2.22x and 2.41x for a 3x slowdown (test_straggler_delay, 4 runs beside a busy
    # loop, 3 failed this way and the old median/relative checks)
    cpu_s = {u: [e["own_s"] * e["cpu"] for e in events(evs, "commit")[1:]]
             for u, evs in slow.items()}
    work = min(min(cpu_s[u]) for u in (0, 2, 3))
    # 3x (not applied gives 1x): the straggler's fastest step takes at least 3 x its own
    # compute, which is at least the work's CPU time (those runs: 3.59x and 3.33x)
    assert min(own[1]) / work > 2.5, (min(own[1]), work)
    # ... and not applied twice (9x): against the others' fastest wall time. Loose: the
    # injected delay is a sleep, and on a loaded machine (a suite run beside other work: load
    # 17 on two cores) each wake-up comes late, which only the straggler pays (measured 4.6x)
    fast = min(min(own[u]) for u in (0, 2, 3))
    assert min(own[1]) / fast < 6.0, (min(own[1]), {u: min(v) for u, v in own.items()})
    # the time is a sleep, not a spin: the straggler burns the others' CPU a step
    assert min(cpu_s[1]) < 1.6 * work, {u: min(v) for u, v in cpu_s.items()}
    # without the trace the same group does the same work as the others (so the 3x above
    # is the trace's): CPU time again, as group 1's wall time with no trace read 1.16x,
    # 1.30x the others' median and 1.84x their minimum beside a busy loop
    base = {u: min(e["own_s"] * e["cpu"] for e in events(plain[u], "commit")[1:])
            for u in plain}
    assert base[1] < 1.6 * min(base[u] for u in (0, 2, 3)), base
    # every commit carries the resource signals
    for u, evs in slow.items():
        for e in events(evs, "commit"):
            assert e["own_s"] > 0 and 0 < e["cpu"] <= 1.05
            # bytes sent are measured, received modelled (the ring's 2(m-1)/m x the buffer):
            # for a ring they agree, up to the journal line written between two samples
            assert 0 < e["rx_bytes"] <= e["tx_bytes"] < e["rx_bytes"] + 10_000, e
    cpu = {u: statistics.median(e["cpu"] for e in events(slow[u], "commit")) for u in slow}
    # sleeping 2/3 of its part, the straggler cannot read above ~1/3 whatever the load (a
    # loaded machine reads it lower still: 0.21-0.34 seen). Not against the others' reading:
    # beside a busy loop they read ~0.4 too, and the sleeper's quick wake-ups lift its own
    # compute's share (0.28 against 0.36-0.40 once). That it sleeps is checked above
    assert cpu[1] < 0.4, cpu
