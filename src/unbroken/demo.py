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
from unbroken.supervise.spec import JobSpec, check as check_spec
from unbroken.supervise.outcome import RunError
from unbroken.supervise.supervisor import Supervisor

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

    sup = Supervisor(spec, emit_line=emit_line, view=view, figure="demo.png")
    _faults, cfg = sup.check()  # bad input before anything starts; warms the fork server
    early = _EarlyReference(cfg)  # computed on idle CPU while the job runs
    try:
        res = sup.run()
        report = res.report
        if res.code != ExitCode.OK:
            raise DemoExit(res.message or f"exit {int(res.code)}", int(res.code), report)
        ref = reference(cfg, Path(spec.out), early=early.result())
    finally:
        early.close()
    report["max_abs_param_diff"] = max(
        (torch.tensor(p, dtype=torch.float64) - ref).abs().max().item()
        for p in res.params.values())
    return report


def reference(cfg, out: Path, early=None):
    """Failure-free single-process run of the same seed (cached by config; ``early``: the
    same run computed beside the job, used when given)."""
    import torch

    from unbroken.runtime.trainer import reference_run

    key = hashlib.sha256(cfg.to_json().encode()).hexdigest()[:16]
    path = out / f"reference-{key}.pt"
    if early is None and path.exists():
        try:
            return torch.load(path)
        except Exception:
            path.unlink()  # a damaged cache is recomputed, never trusted
    ref = reference_run(cfg) if early is None else early
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    torch.save(ref, tmp)
    os.replace(tmp, path)
    return ref


class _EarlyReference:
    """The reference run in a process of its own at a low CPU priority, started with the
    job: it uses the CPU the job leaves idle (waits for a heartbeat, a straggler's sleep), so
    the comparison is ready when the job ends instead of costing a second single-process run
    after it (steps x groups gradients: ~30 s for the 200-step demo on this machine). Any
    failure of it only means the reference is computed afterwards, as before."""

    def __init__(self, cfg) -> None:
        import tempfile

        from unbroken import spawn

        self.dir = tempfile.mkdtemp(prefix="unbroken-ref-")
        self.path = os.path.join(self.dir, "ref.pt")
        try:
            self.worker = spawn.start("unbroken.demo:_reference_entry", [cfg.to_json(), self.path],
                                      stderr_path=os.path.join(self.dir, "stderr"))
        except Exception:
            self.worker = None

    def result(self):
        """The reference tensor, or None (then the caller computes it)."""
        if self.worker is None:
            return None
        try:  # the job is over: back to normal priority where allowed (root, CAP_SYS_NICE)
            os.setpriority(os.PRIO_PROCESS, self.worker.pid, 0)
        except OSError:
            pass
        try:
            if self.worker.wait(timeout=600) != 0:
                return None
            import torch

            return torch.load(self.path)
        except Exception:
            return None

    def close(self) -> None:
        import shutil

        if self.worker is not None and self.worker.poll() is None:
            self.worker.kill()
            self.worker.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _reference_entry(argv: list[str]) -> None:
    """Child of :class:`_EarlyReference`: ``argv`` = [config JSON, output path]."""
    import torch

    from unbroken.runtime.config import TrainConfig
    from unbroken.runtime.trainer import reference_run

    # low priority, not the lowest: at nice 19 a machine busy with other work starved it
    # (it keeps the spawn server's PR_SET_PDEATHSIG: it dies with the launcher)
    os.nice(10)
    ref = reference_run(TrainConfig.from_json(argv[0]))
    tmp = argv[1] + ".tmp"
    torch.save(ref, tmp)
    os.replace(tmp, argv[1])
