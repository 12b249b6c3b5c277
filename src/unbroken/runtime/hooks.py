"""The one place a worker lets outside code into its step: :class:`StepHooks` and plug-ins.

Why a plug-in and not flags: fault injection (``unbroken.testing.faults``) must act at exact
points of a group's own step (SIGKILL after the gradients, drop a completed all-reduce, serve a
corrupt snapshot) so that a seed and a schedule give the same run every time. Threading those
points through the step as fault flags put test scaffolding in the production path. Instead the
runner calls a :class:`StepHooks` at six points (no-ops by default) and the worker installs a
:class:`Plugin` only when its launcher names one (``--plugin MODULE:FUNC``): a job run without
faults imports no injection code at all (``tests/test_layering.py`` checks ``sys.modules``).

Contract of a plug-in factory ``FUNC(args: dict, uid: int, cfg: TrainConfig) -> Plugin``:
``args`` is the JSON object of ``--plugin-args``; it raises ``ValueError`` (one line naming the
bad value) on bad arguments. The hooks run on the training thread, inside the step: they must
not block unless blocking is the fault they inject.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["StepHooks", "NoHooks", "Plugin", "load_plugin"]


class StepHooks(Protocol):
    """Points of a group's step where a plug-in acts. Subclass it for the no-op defaults."""

    def wrap_trainer(self, runner: Any, trainer: Any) -> Any:
        """Every trainer the runner steps with (the start, each hot update)."""
        return trainer

    def step_ready(self, runner: Any) -> None:
        """Once a step: its gradients are computed, its all-reduce not issued yet."""

    def before_allreduce(self, runner: Any) -> None:
        """Just before each issue of the step's all-reduce (the first and every retry)."""

    def before_patch(self, runner: Any) -> None:
        """A failure re-plan gave this group patch types; before computing them."""

    def after_replan(self, runner: Any, plan: Any) -> None:
        """After a failure re-plan is journaled, before the retried op."""

    def state_payload(self, runner: Any, payload: torch.Tensor) -> torch.Tensor:
        """The snapshot this member serves a joiner (what goes into the state copy)."""
        return payload


class NoHooks(StepHooks):
    """The runner's hooks when nothing is installed: every point a no-op."""


@runtime_checkable
class Plugin(Protocol):
    """What a plug-in installs into a worker process."""

    hooks: StepHooks

    def wrap_comm(self, comm: Any) -> Any:
        """The communicator the runner gets (``comm`` itself, or a wrapper around it)."""
        ...

    def assigned(self, runner: Any) -> None:
        """A warm spare was given a slot (its runner built, about to join)."""
        ...


def load_plugin(spec: str, args: dict, uid: int, cfg: Any) -> Plugin:
    """Import ``MODULE:FUNC`` and call it; ValueError (one line) on a bad spec."""
    module, _, func = spec.partition(":")
    if not module or not func:
        raise ValueError(f"--plugin {spec!r}: expected MODULE:FUNC")
    try:
        factory = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--plugin {spec!r}: {e}") from None
    plugin = factory(args, uid, cfg)
    if not isinstance(plugin, Plugin):
        raise ValueError(f"--plugin {spec!r}: {type(plugin).__name__} is not a Plugin "
                         f"(needs hooks, wrap_comm, assigned)")
    return plugin
