"""``unbroken demo``: ``unbroken run`` with the built-in GPT, a fault schedule and a reference.

A thin preset, not a second supervisor: it fills a :class:`~unbroken.supervise.JobSpec`
(trainer ``gpt``: a 137k-parameter byte-level GPT on the Python standard library's sources,
:mod:`unbroken.runtime.gpt`), a default fault schedule for the size (a kill, a hang, and two
failures close together that wipe out a shard type), runs it with the
:class:`~unbroken.supervise.Supervisor`, and then compares the final parameters with a
failure-free single-process run of the same seed (cached in the run directory).

Each ``make demo`` starts over (``fresh``): the previous run's files move to
``<out>/previous-<time>/``; ``--resume`` continues the last one instead.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from unbroken.core.faults import default_faults, format_faults
from unbroken.protocol import ExitCode
from unbroken.supervise.spec import JobSpec, check as check_spec, train_config
from unbroken.supervise.supervisor import RunError, Supervisor

__all__ = ["demo_spec", "check", "run_demo", "DemoError", "DemoExit", "reference"]

DemoError = RunError  # the run could not finish


class DemoExit(RuntimeError):
    """The run stopped on purpose with a documented exit code (5, 6, 130, 143)."""

    def __init__(self, message: str, code: int, report: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.report = code, report


def demo_spec(*, faults: str | None = None, chaos: int | None = None, out: str = "out/demo",
              **kw: Any) -> JobSpec:
    """The demo's job: the built-in GPT, the default fault schedule when none is given (a
    chaos seed draws its own), a fresh start unless resuming. ``kw``: the other
    :class:`JobSpec` fields (``ft``: its :class:`~unbroken.supervise.spec.FTConfig`)."""
    spec = JobSpec(trainer="gpt", chaos=chaos, out=out, **kw)
    if faults is None and chaos is None:
        faults = format_faults(default_faults(spec.groups, spec.steps)) or "none"
    return replace(spec, faults=faults, fresh=not spec.resume)


def check(spec: JobSpec):
    """Validate before anything starts; raises ValueError (one line naming the value)."""
    return check_spec(spec)


def run_demo(spec: JobSpec, *, emit_line: Callable[[str], None] | None = None,
             view: Any = None) -> dict:
    """Run the preset; returns the report with the reference comparison. Raises
    :class:`DemoError` when the run could not finish, :class:`DemoExit` when it stopped on
    purpose."""
    import torch

    res = Supervisor(spec, emit_line=emit_line, view=view, figure="demo.png").run()
    report = res.report
    if res.code != ExitCode.OK:
        raise DemoExit(res.message or f"exit {int(res.code)}", int(res.code), report)
    faults = check_spec(spec)
    ref = reference(train_config(spec, spec.sdc_interval(faults)), Path(spec.out))
    report["max_abs_param_diff"] = max(
        (torch.tensor(p, dtype=torch.float64) - ref).abs().max().item()
        for p in res.params.values())
    return report


def reference(cfg, out: Path):
    """Failure-free single-process run of the same seed (cached by config)."""
    import torch

    from unbroken.runtime.trainer import reference_run

    key = hashlib.sha256(cfg.to_json().encode()).hexdigest()[:16]
    path = out / f"reference-{key}.pt"
    if path.exists():
        try:
            return torch.load(path)
        except Exception:
            path.unlink()  # a damaged cache is recomputed, never trusted
    ref = reference_run(cfg)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    torch.save(ref, tmp)
    os.replace(tmp, path)
    return ref
