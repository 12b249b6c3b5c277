"""The supervisor side of a job: what to run (``spec``), where its files live (``outdir``), the
supervisor that launches and restarts it (``supervisor``, with its own ``heartbeat``), the
cluster of an attempt (``launch``; local processes: ``local``, a group of several ranks as one
process: ``rankgroup``), one attempt's loop that watches and repairs it (``attempt``, reading
the journals through ``tail``), how a run ends (``outcome``), the fire-drill faults it writes
itself (``drill``), and the train face's commands (``cli``).

The arrows run one way: ``supervisor`` -> ``attempt`` -> ``outcome``/``spec``/``tail``/``drill``;
an attempt knows its supervisor only as the three things it is handed (spec, emit, signal)."""

from unbroken.supervise.outcome import RunError, RunResult
from unbroken.supervise.spec import FTConfig, JobSpec, TrainerError
from unbroken.supervise.supervisor import Supervisor

__all__ = ["JobSpec", "FTConfig", "TrainerError", "Supervisor", "RunResult", "RunError"]
