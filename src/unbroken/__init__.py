"""unbroken: keep large-scale LLM pretraining running through failures.

The names a user needs, and nothing else (every other module is internal and may change)::

    import unbroken

    ft = unbroken.FTConfig(redundancy=2, guard="act", staleness=1.0, ckpt_every=50)
    spec = unbroken.JobSpec(trainer="mypkg.train:make", trainer_args={"d_model": 64},
                            groups=4, steps=500, out="out/run", ft=ft)
    result = unbroken.Supervisor(spec).run()      # -> unbroken.RunResult
    assert result.code == unbroken.ExitCode.OK

``JobSpec``      what to train and where (an importable trainer factory and its arguments, the
                 groups, steps, seed, out dir, a fault drill); ``ft`` says how it is kept running
``FTConfig``     the fault-tolerance config: redundancy, spares, staleness and heartbeat (how
                 long a silent member is tolerated), guard, ladder, checkpoint and SDC periods
``TrainerLike``  the protocol a trainer implements; ``ModuleTrainer`` builds one from a model,
                 an optimizer, a dataset and a loss
``LadderPolicy`` the recovery ladder's attempts and budgets (``FTConfig.ladder`` overrides them)
``Supervisor``   launches, watches and repairs the job; ``run()`` returns a ``RunResult``
``ExitCode``     every exit code the workers and the command use

Names resolve lazily, so ``import unbroken`` does not import torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["JobSpec", "FTConfig", "TrainerLike", "ModuleTrainer", "LadderPolicy", "Supervisor",
           "RunResult", "ExitCode", "__version__"]

_WHERE = {
    "JobSpec": "unbroken.supervise.spec",
    "FTConfig": "unbroken.supervise.spec",
    "Supervisor": "unbroken.supervise.supervisor",
    "RunResult": "unbroken.supervise.outcome",
    "TrainerLike": "unbroken.runtime.trainer",
    "ModuleTrainer": "unbroken.runtime.module_trainer",
    "LadderPolicy": "unbroken.core.ladder",
    "ExitCode": "unbroken.protocol",
}


def __getattr__(name: str):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'unbroken' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
