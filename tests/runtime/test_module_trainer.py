"""A user's own (model, optimizer, dataset, loss) under stacked data parallelism: the adapter
computes the right shard gradients, and a real multi-process run with a kill ends where a
failure-free single-process run of the same factory ends."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

from helpers import finish, kill_and_notify  # noqa: E402

from unbroken.runtime.module_trainer import ModuleTrainer  # noqa: E402
from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.trainer import make_trainer, reference_run  # noqa: E402
from unbroken.supervise.local import StackedCluster  # noqa: E402

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
CFG = TrainConfig(groups=4, redundancy=2, steps=20, seed=2, shard_size=16,
                  model="user_trainer:make")


def test_shard_gradient_is_the_gradient_of_the_mean_loss_on_that_shard():
    tr = make_trainer(CFG)
    assert isinstance(tr, ModuleTrainer)
    idx = tr.data.shard(3, 2)
    x, y = tr.dataset[idx]
    loss = torch.nn.functional.mse_loss(tr.model(x), y)
    want = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, tr.params)])
    assert torch.equal(tr.grad(3, 2), want)
    assert tr.last_loss[2] == pytest.approx(float(loss.detach()))


def test_lazy_state_optimizer_is_refused_with_one_line():
    m = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="Adagrad.*supported: SGD, Adam, AdamW"):
        ModuleTrainer(CFG, m, torch.optim.Adagrad(m.parameters()), [0] * 64, lambda a, b: a)


@pytest.mark.mp
@pytest.mark.timeout(150)
def test_user_model_through_a_kill_matches_the_failure_free_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ref = reference_run(CFG)
    survivors = [0, 2, 3]
    with StackedCluster(CFG, str(tmp_path), die_at={1: 7}) as c:
        kill_and_notify(c, [1], survivors)
        finish(c, CFG, survivors, ref, tol=1e-9)
