"""``--sync mask`` in real worker processes (4 gloo groups) against a persistent 3x straggler
(``persistent:1@3``, a real sleep inside the worker's gradient): the straggler is left out of
the step, its shard type is computed by its other host, training finishes sooner than
``--sync sync`` under the same trace, and the parameters are those of the straggler-free run
up to float summation order, every sample counted exactly once. Synchronisation: store keys
and process exits only."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

pytest.importorskip("torch")

from helpers import events  # noqa: E402
from test_straggler_delay import _run  # noqa: E402  (a cluster run: params and journals)

from unbroken.core.shards import exactly_once  # noqa: E402
from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.ledger import ledger_records  # noqa: E402
from unbroken.runtime.trainer import reference_run  # noqa: E402

pytestmark = pytest.mark.mp

# a gradient of ~10 ms, so a 3x straggler costs ~20 ms a step: above the scheduler's noise
CFG = TrainConfig(groups=4, redundancy=2, steps=30, seed=5, shard_size=1024,
                  trainer_args={"hidden": 256, "dim": 64, "dataset_size": 8192},
                  stragglers="persistent:1@3")


def _intervals(journal: list[dict], first: int) -> list[float]:
    t = {e["step"]: e["t"] for e in events(journal, "commit")}
    return [t[k] - t[k - 1] for k in range(first + 1, CFG.steps)]


@pytest.mark.timeout(120)
def test_mask_leaves_a_3x_straggler_out_sooner_than_sync_with_the_same_parameters(tmp_path):
    import torch

    sync_params, sync = _run(CFG, tmp_path / "sync")
    mask_params, mask = _run(replace(CFG, sync="mask"), tmp_path / "mask")
    ref = reference_run(replace(CFG, stragglers=None)).tolist()  # straggler-free, one process
    for u in mask_params:
        assert sync_params[u] == sync_params[0]
        diff = (torch.tensor(mask_params[u]) - torch.tensor(ref)).abs().max().item()
        assert diff < 1e-9, (u, diff)  # the synchronous gradient, up to the order of a sum
    rep = exactly_once(ledger_records(mask), CFG.steps, CFG.groups)
    assert rep.ok and rep.records == CFG.steps * CFG.groups, rep
    benches = events(mask[0], "bench")
    assert benches and benches[0]["bench"] == [1], benches
    first = benches[0]["step"]
    assert all(e["mine"] == [] for e in events(mask[1], "commit")[first:])
    # every member decided the same at the same boundary
    key = [(e["step"], e["bench"]) for e in benches]
    assert all([(e["step"], e["bench"]) for e in events(mask[u], "bench")] == key for u in mask)
    # sooner: the steps after the bench against the same steps under sync (medians: the
    # machine is shared), and the whole run's training time
    med_mask = statistics.median(_intervals(mask[0], first))
    med_sync = statistics.median(_intervals(sync[0], first))
    assert med_mask < 0.85 * med_sync, (med_mask, med_sync)
    total = {name: j[0][-1]["t"] - events(j[0], "commit")[0]["t"]
             for name, j in (("sync", sync), ("mask", mask))}
    assert total["mask"] < total["sync"], total
