"""The trainer seam: model hyperparameters are the factory's keyword arguments
(``TrainConfig.trainer_args``) for the built-in "mlp" and "gpt" exactly as for a user's
factory; an unknown one is bad input naming it; the trainers and the ledger do not import the
runner (no gpt <-> stacked cycle)."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from unbroken.runtime.config import TrainConfig  # noqa: E402
from unbroken.runtime.gpt import GPTTrainer  # noqa: E402
from unbroken.runtime.mlp import MLPTrainer  # noqa: E402
from unbroken.runtime.trainer import make_trainer, reference_run  # noqa: E402
from unbroken.supervise.spec import JobSpec, TrainerError, load_trainer, train_config  # noqa: E402

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "unbroken" / "runtime"
CORE = RUNTIME.parent / "core"


def test_trainer_args_reach_the_builtin_mlp():
    tr = make_trainer(TrainConfig(trainer_args={"dim": 5, "hidden": 3, "lr": 0.01,
                                                "momentum": 0.5, "dataset_size": 64}))
    assert isinstance(tr, MLPTrainer)
    assert tr.numel == 5 * 3 + 3 + 3 * 1 + 1
    assert tr.x.shape == (64, 5)
    assert (tr.opt.param_groups[0]["lr"], tr.opt.param_groups[0]["momentum"]) == (0.01, 0.5)


def test_trainer_args_reach_the_builtin_gpt():
    args = {"seq_len": 8, "d_model": 16, "n_layer": 1, "n_head": 2, "lr": 1e-3,
            "dataset_size": 64}
    tr = make_trainer(TrainConfig(model="gpt", trainer_args=args))
    assert isinstance(tr, GPTTrainer)
    assert len(tr.model.blocks) == 1 and tr.model.tok.embedding_dim == 16
    assert tr.batch(0, 0)[0].shape == (8, 8)  # (shard_size, seq_len)
    assert tr.opt.param_groups[0]["lr"] == 1e-3


def test_the_runtime_config_holds_no_model_hyperparameters():
    names = {f.name for f in fields(TrainConfig)}
    model_only = {"dim", "hidden", "lr", "momentum", "seq_len", "d_model", "n_layer", "n_head",
                  "dataset_size"}
    assert not names & model_only


def test_a_value_given_equals_its_default():
    """The keyword defaults are the old TrainConfig defaults: naming them changes nothing."""
    a = reference_run(TrainConfig(steps=3, seed=1))
    b = reference_run(TrainConfig(steps=3, seed=1, trainer_args={
        "dim": 8, "hidden": 16, "lr": 0.05, "momentum": 0.9, "dataset_size": 256}))
    assert torch.equal(a, b)


def test_the_job_overrides_the_builtin_gpt_settings():
    assert train_config(JobSpec(trainer="gpt")).trainer_args == {"lr": 3e-3,
                                                                 "dataset_size": 8192}
    assert train_config(JobSpec(trainer="gpt", trainer_args={"lr": 1e-3, "n_layer": 1})
                        ).trainer_args == {"lr": 1e-3, "dataset_size": 8192, "n_layer": 1}
    assert train_config(JobSpec(trainer="mlp", trainer_args={"hidden": 4})
                        ).trainer_args == {"hidden": 4}


@pytest.mark.parametrize("trainer", ["mlp", "gpt"])
def test_an_unknown_hyperparameter_is_a_trainer_error_naming_it(trainer):
    with pytest.raises(TrainerError, match="unexpected keyword argument 'depth'") as e:
        load_trainer(train_config(JobSpec(trainer=trainer, trainer_args={"depth": 3})))
    assert len(str(e.value).splitlines()) == 1


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("path", [RUNTIME / f"{m}.py" for m in (
    "config", "trainer", "mlp", "gpt", "module_trainer")] + [CORE / "ledger.py"],
    ids=lambda p: p.stem)
def test_trainers_and_the_ledger_do_not_import_the_runner(path):
    assert "unbroken.runtime.stacked" not in _imports(path)


def test_the_ledger_and_the_config_are_pure():
    for path in (CORE / "ledger.py", RUNTIME / "config.py"):
        imports = _imports(path)
        assert imports and not {m for m in imports if m.split(".")[0] in ("torch", "numpy")}
        assert not {m for m in imports if m.startswith("unbroken.runtime")}, path
