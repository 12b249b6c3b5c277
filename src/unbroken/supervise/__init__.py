"""The supervisor side of a job: what to run (``spec``), where its files live (``outdir``), the
supervisor that launches, watches and repairs it (``supervisor``), and the fire-drill faults it
writes itself (``drill``)."""

from unbroken.supervise.spec import FTConfig, JobSpec, TrainerError
from unbroken.supervise.supervisor import RunError, RunResult, Supervisor

__all__ = ["JobSpec", "FTConfig", "TrainerError", "Supervisor", "RunResult", "RunError"]
