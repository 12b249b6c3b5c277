"""What a user asks the supervisor to run: a :class:`JobSpec` (what to train and where) with its
:class:`FTConfig` (how it is kept running), validated before anything starts.

Why the trainer is a name and not an object: every worker and every warm spare is its own OS
process and must build the *same* trainer, so the spec carries an importable factory
(``"package.module:make"``) and its keyword arguments as JSON (``trainer_args``: the model's
hyperparameters). The fault-tolerance settings (redundancy, spares, staleness, guard, ladder,
checkpoints) are one :class:`FTConfig` (``JobSpec.ft``) and nowhere in the model's code.

``check`` is the one validation pass: every bad value gives one line naming it (a
``ValueError``), before a process or a file exists. It also imports and builds the trainer
once in this process, so an unknown module, a factory that raises or one that returns
something that is not a trainer is bad input too, not a worker traceback.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from unbroken.core.faults import (NEED_ACT, NODE_KINDS, REMOVING, Fault, chaos_faults, parse_faults,
                                  soak_faults)
from unbroken.core.placement import check as check_placement

__all__ = ["JobSpec", "FTConfig", "TrainerError", "check", "check_ranks", "check_sharding_of",
           "node_warning", "spares_for", "train_config", "load_trainer"]

#: what a trainer must offer (``runtime.trainer.TrainerLike``)
_TRAINER_API = ("grad", "apply", "flat_params", "state_tensors", "numel")


class TrainerError(ValueError):
    """The trainer cannot be imported or built (bad input: exit 2)."""


@dataclass(frozen=True)
class FTConfig:
    """How the job is kept running: the fault-tolerance settings and the failure semantics and
    latency budgets they set. A worker failure never restarts the job: the shard types it held
    are still computed by its ``redundancy - 1`` peers, a warm spare takes its place, the guard
    answers what the runtime cannot mask, and the job rolls back to a checkpoint only as a last
    resort. ``check`` validates every field (one line naming the bad value, a ``ValueError``)."""

    #: groups computing each shard type: a step survives r - 1 lost groups of one shard type
    redundancy: int = 2
    #: warm spares started with the job (None: one per scheduled fault that takes a process)
    spares: int | None = None
    #: size the warm pool as the P99 of Binomial(groups, p) instead (excludes ``spares``)
    standby_p: float | None = None
    #: seconds a silent member (no heartbeat) is tolerated before it is removed: the detection
    #: budget for a killed or hung process
    staleness: float = 0.3
    #: seconds between a member's heartbeats (must be below ``staleness``)
    heartbeat: float = 0.1
    #: members stop with a checkpoint (exit 5) when the supervisor is this many seconds silent
    supervisor_staleness: float = 5.0
    #: node agents only: seconds an agent's heartbeat may be silent before its node is lost
    #: (a cut-off machine; a killed agent is seen at once)
    node_staleness: float = 1.0
    #: checkpoint every K steps (None: 50, or 10 for a chaos run): the most steps a roll-back
    #: redoes
    ckpt_every: int | None = None
    #: "log": the guard reports what it sees; "act": it acts (ends a stall, undoes a NaN or a
    #: corruption, rolls back an update) through the recovery ladder
    guard: str = "log"
    #: the ladder's overrides ("key=value,..." over the one-machine defaults, see ``policy``)
    ladder: str | None = None
    #: the redundant SDC check's period in steps (None: the checkpoint period when a bit flip
    #: is scheduled, else off; 0: off)
    sdc_every: int | None = None
    #: serve Prometheus metrics on this port (None: no exporter)
    metrics_port: int | None = None
    #: a kernel log to tail for GPU XID errors (None: none, or the run's own ``kernel.log``
    #: when an xid fault is scheduled)
    xid_log: str | None = None

    def policy(self):
        """The guard's ladder policy: the defaults at the scale of one machine (a queued update
        is forced after 5 s, not 24 h; a requeue backs off 2 s doubling to 60 s, not 10 min
        to 1 h: restarting local processes costs seconds), then ``ladder``'s overrides."""
        from unbroken.core.ladder import LadderPolicy, parse_policy

        base = LadderPolicy(update_deadline=5.0, backoff_base=2.0, backoff_cap=60.0)
        return parse_policy(self.ladder, base) if self.ladder else base

    def check(self) -> None:
        """Validate every field; raises ValueError (one line naming the value)."""
        if self.redundancy < 1:
            raise ValueError(f"--redundancy {self.redundancy}: must be at least 1")
        if self.guard not in ("log", "act"):
            raise ValueError(f"--guard {self.guard!r}: expected 'log' or 'act'")
        self.policy()  # an impossible ladder budget is bad input, before anything starts
        if self.sdc_every is not None and self.sdc_every < 0:
            raise ValueError(f"--sdc-every {self.sdc_every}: must be >= 0 (0: off)")
        if self.ckpt_every is not None and self.ckpt_every < 1:
            raise ValueError(f"--ckpt-every {self.ckpt_every}: must be at least 1")
        if self.spares is not None and self.spares < 0:
            raise ValueError(f"--spares {self.spares}: must be >= 0")
        if self.standby_p is not None:
            if self.spares is not None:
                raise ValueError("--spares and --standby-p exclude each other")
            from unbroken.core.standby import standby_size

            standby_size(1, self.standby_p)  # StandbyError (a ValueError) names p
        if not 0 < self.heartbeat < self.staleness:
            raise ValueError(f"--staleness {self.staleness}: must exceed the heartbeat period "
                             f"{self.heartbeat}")
        if not self.node_staleness > self.heartbeat:
            raise ValueError(f"--node-staleness {self.node_staleness}: must exceed the "
                             f"heartbeat period {self.heartbeat}")
        if not self.supervisor_staleness > self.heartbeat:
            raise ValueError(f"supervisor staleness {self.supervisor_staleness}: must exceed "
                             f"the heartbeat period {self.heartbeat}")


@dataclass(frozen=True)
class JobSpec:
    """A training job under the supervisor: what to train and where; ``ft`` says how it is
    kept running. ``trainer``: "package.module:factory" (called as ``factory(cfg,
    **trainer_args)`` in every worker) or a built-in ("gpt", "mlp")."""

    trainer: str
    trainer_args: dict = field(default_factory=dict)
    groups: int = 4               # data-parallel groups, one worker process each
    steps: int = 200
    seed: int = 0
    shard_size: int = 8           # samples per shard type per step (each group's micro-batch)
    out: str = "out/run"
    resume: bool = False          # continue from the newest valid checkpoint in out/ckpt
    fresh: bool = False           # start over in an out dir that holds a run (it is kept aside)
    faults: str | None = None     # a fire drill: "kind:group@step,..." or "none"
    chaos: int | None = None      # a seeded mix of every fault kind (needs guard "act")
    chaos_faults: int | None = None  # ... of this many faults, slots failing again (a soak)
    timeout: float = 600.0
    unguarded: bool = False       # bench only: faults that need an acting guard, log-only
    stragglers: str | None = None  # a straggler trace (unbroken.core.stragglers) or "none"
    target_loss: float | None = None  # report the time the committed loss first reaches it
    local_nodes: int = 0          # run the groups under K node agents on this machine (0: none)
    nodes: int = 0                # ... under K node agents started elsewhere (unbroken agent)
    listen: int = 0               # with nodes: the directory's port the agents are given
    sync: str = "sync"            # the sync mode (unbroken.core.sync.parse_mode)
    selector: str | None = None   # auto's chooser: an ML selector model file (None: heuristic)
    ranks_per_group: int = 1      # processes in one group (the model sharded over them)
    shard: str = "none"           # how: "fsdp" (FSDP2), "tp" (tensor parallelism), "none"
    max_procs: int = 128          # worker processes this launcher may start (spares included)
    device: str = "cpu"           # "cpu" (gloo) or "cuda" (a GPU a process, NCCL)
    ft: FTConfig = field(default_factory=FTConfig)

    def fault_list(self) -> list[Fault]:
        if self.chaos is not None and self.chaos_faults is not None:
            return soak_faults(self.chaos, self.groups, self.steps, self.chaos_faults)
        if self.chaos is not None:
            return chaos_faults(self.chaos, self.groups, self.steps)
        if self.faults is None:
            return []
        return parse_faults(self.faults, self.groups, self.steps, self.local_nodes)

    def ckpt_interval(self) -> int:
        """Checkpoint period: ``ft.ckpt_every``, or 10 for a chaos run (its SDC roll-back
        target, so a bit flip costs at most 10 redone steps)."""
        return self.ft.ckpt_every if self.ft.ckpt_every is not None else (
            10 if self.chaos is not None else 50)

    def sdc_interval(self, faults: list[Fault]) -> int:
        """The redundant check's period: the checkpoint interval, so the checkpoint written
        after a passing check is the verified roll-back target."""
        if self.ft.sdc_every is not None:
            return self.ft.sdc_every
        return self.ckpt_interval() if any(f.kind == "flip" for f in faults) else 0


def check(spec: JobSpec) -> list[Fault]:
    """Validate before anything starts; raises ValueError (one line naming the value)."""
    ft = spec.ft
    if spec.groups < 2:
        raise ValueError(f"--groups {spec.groups}: stacked data parallelism needs at least 2 "
                         f"groups")
    ft.check()
    check_placement(spec.groups, ft.redundancy)
    if spec.steps < 2:
        raise ValueError(f"--steps {spec.steps}: need at least 2 steps")
    check_ranks(spec)
    if spec.shard_size < 1:
        raise ValueError(f"--shard-size {spec.shard_size}: must be at least 1")
    if spec.chaos is not None and (spec.chaos < 0 or spec.faults is not None):
        raise ValueError(f"--chaos {spec.chaos}: needs a seed >= 0 and no --faults"
                         if spec.chaos < 0 else "--chaos and --faults exclude each other")
    if spec.chaos_faults is not None and spec.chaos is None:
        raise ValueError(f"--chaos-faults {spec.chaos_faults}: needs --chaos SEED")
    if spec.resume and spec.fresh:
        raise ValueError("--resume and --fresh exclude each other")
    if spec.local_nodes or spec.nodes:
        node_warning(spec)  # more nodes than groups: ValueError
    if spec.nodes:
        check_listen(spec.listen)
    elif spec.listen:
        raise ValueError(f"--listen {spec.listen}: needs --nodes K (the agents it is for)")
    needy = [f for f in spec.fault_list() if f.kind in NEED_ACT]
    if needy and ft.guard != "act" and not spec.unguarded:
        raise ValueError(f"fault {needy[0].spec!r} needs --guard act (a log-only guard cannot "
                         f"end a stall, undo a NaN or corruption, or roll back code)")
    if ft.standby_p is not None:
        from unbroken.core.standby import standby_size

        standby_size(spec.groups, ft.standby_p)  # StandbyError (a ValueError) names p
    if spec.stragglers is not None:
        from unbroken.runtime.stragglers import load_trace

        load_trace(spec.stragglers, spec.groups)  # StragglerSpecError (a ValueError)
    if spec.sync != "sync":
        check_sync(spec.sync, spec.groups, ft.redundancy)
    if spec.selector is not None:
        check_selector(spec.selector, spec.sync, spec.groups, spec.shard_size, ft.redundancy,
                       _host_cores(spec))
    if spec.target_loss is not None and not math.isfinite(spec.target_loss):
        raise ValueError(f"--target-loss {spec.target_loss}: expected a finite number")
    try:
        json.dumps(spec.trainer_args)
    except (TypeError, ValueError):
        raise TrainerError(f"--trainer-args {spec.trainer_args!r}: not JSON") from None
    if not isinstance(spec.trainer_args, dict):
        raise TrainerError(f"--trainer-args {json.dumps(spec.trainer_args)}: expected a JSON "
                           f"object (the factory's keyword arguments)")
    faults = spec.fault_list()
    check_device(spec, spares_for(spec, faults))
    return faults


def check_device(spec: JobSpec, spares: int) -> None:
    """``--device``: cpu, or cuda with a GPU for every process this machine starts (NCCL
    refuses two ranks of one communicator on one GPU); ValueError (one line)."""
    if spec.device == "cpu":
        return
    if spec.device != "cuda":
        raise ValueError(f"--device {spec.device!r}: expected cpu or cuda")
    if spec.nodes or spec.local_nodes:
        raise ValueError("--device cuda with node agents: not built (one machine's GPUs only)")
    import torch

    gpus = torch.cuda.device_count()
    need = (spec.groups + spares) * spec.ranks_per_group
    if gpus < need:
        raise ValueError(f"--device cuda: {gpus} CUDA devices here (torch {torch.__version__})"
                         f", {need} needed: one per process ({spec.groups} groups and {spares} "
                         f"spares of {spec.ranks_per_group} ranks)")


def check_ranks(spec: JobSpec) -> None:
    """``--ranks-per-group`` / ``--shard`` / ``--max-procs``: a group of R ranks shards its
    model with fsdp or tp (R = 1: none), and the groups' processes fit the launcher's limit;
    ValueError (one line). Whether the model itself can be sharded so is checked when the
    trainer is built (``check_sharding``)."""
    from unbroken.runtime.sharding import SHARD_MODES

    r = spec.ranks_per_group
    if r < 1:
        raise ValueError(f"--ranks-per-group {r}: must be at least 1")
    if spec.shard not in SHARD_MODES:
        raise ValueError(f"--shard {spec.shard!r}: expected one of {', '.join(SHARD_MODES)}")
    if r > 1 and spec.shard == "none":
        raise ValueError(f"--ranks-per-group {r}: needs --shard fsdp or tp (how the group's "
                         f"ranks share the model)")
    if r == 1 and spec.shard != "none":
        raise ValueError(f"--shard {spec.shard}: needs --ranks-per-group of at least 2")
    if spec.max_procs < 1:
        raise ValueError(f"--max-procs {spec.max_procs}: must be at least 1")
    if spec.groups * r > spec.max_procs:
        raise ValueError(f"--groups {spec.groups} x --ranks-per-group {r} = {spec.groups * r} "
                         f"worker processes: more than --max-procs {spec.max_procs}")


def check_sharding_of(spec: JobSpec, trainer) -> None:
    """The built trainer can be sharded as asked (``runtime.sharding.check_sharding``:
    ShardingError, a ValueError, names the value); nothing for R = 1."""
    if spec.ranks_per_group > 1:
        from unbroken.runtime.sharding import check_sharding

        check_sharding(trainer, spec.shard, spec.ranks_per_group)


def node_warning(spec: JobSpec) -> str | None:
    """With node agents: one line when a node loss is not safe on ``local_nodes`` nodes (the
    nodes it would take), None when it is; ValueError (bad input) unless 1 <= nodes <= groups."""
    from unbroken.core.nodes import place_groups

    for flag, k in (("--local-nodes", spec.local_nodes), ("--nodes", spec.nodes)):
        if k < 0:
            raise ValueError(f"{flag} {k}: must be >= 0 (0: no agents)")
    if spec.local_nodes and spec.nodes:
        raise ValueError("--local-nodes and --nodes exclude each other")
    flag = "--local-nodes" if spec.local_nodes else "--nodes"
    try:
        return place_groups(spec.groups, spec.ft.redundancy, spec.local_nodes or spec.nodes)[1]
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


def check_listen(port: int) -> None:
    """``--listen``: a port this host can listen on (0: any); ValueError (one line)."""
    import socket

    if not 0 <= port < 65536:
        raise ValueError(f"--listen {port}: expected a port 0..65535")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            raise ValueError(f"--listen {port}: cannot listen there ({e.strerror})") from None


def check_sync(text: str, groups: int, redundancy: int) -> None:
    """``--sync``: a known mode with K in range (``core.sync.parse_mode``) that the runtime
    builds; ValueError (one line) otherwise."""
    from unbroken.core.sync import RUNTIME_MODES, parse_mode

    try:
        mode = parse_mode(text, groups)
    except ValueError as e:
        raise ValueError(f"--sync: {e}") from None
    if mode.name not in RUNTIME_MODES:
        raise ValueError(f"--sync {text}: not built in the runtime yet (built: "
                         f"{', '.join(RUNTIME_MODES)}; groups and async exist only in the "
                         f"planner's TTA model, unbroken.core.sync)")
    if redundancy < 2 and mode.name in ("mask", "auto"):
        raise ValueError(f"--sync {text}: leaving a group out needs --redundancy >= 2 (got "
                         f"{redundancy})")


def check_selector(path: str, sync: str, groups: int, shard_batch: int,
                   redundancy: int, cores: int = 0) -> None:
    """``--selector``: with ``--sync auto``, a selector model file that loads (checksum,
    weights), labelled for the runtime (``train-selector --runtime``: the planner's STAR-model
    selector learned another cost model and other modes) and for this job's groups, shard
    batch, redundancy and shared cores (``TrainConfig.host_cores``: its labels depend on all
    four, and the network sees only the times and the noise scale, so a selector labelled
    for a device per group would choose for another machine); ValueError (one line)."""
    if sync != "auto":
        raise ValueError(f"--selector {path}: chooses auto's mode; it needs --sync auto "
                         f"(got --sync {sync})")
    from unbroken.runtime.mlselector import load_selector

    meta = load_selector(path).meta  # ModelFileError (a ValueError) names the file
    train = (f"train one with unbroken sync train-selector --runtime --groups {groups} "
             f"--shard-batch {shard_batch} --redundancy {redundancy}"
             + (f" --cores {cores}" if cores else ""))
    if meta.get("for") != "runtime":
        raise ValueError(f"--selector {path}: a planner's selector (STAR's cost model, every "
                         f"mode), not the runtime's; {train}")
    got = (meta.get("groups"), meta.get("shard_batch"),
           meta.get("cost_model", {}).get("redundancy"))
    if got != (groups, shard_batch, redundancy):
        raise ValueError(f"--selector {path}: trained for {got[0]} groups, shard batch "
                         f"{got[1]}, redundancy {got[2]}; the job has {groups}, {shard_batch}, "
                         f"{redundancy} ({train})")
    have = int(meta.get("cost_model", {}).get("cores", 0) or 0)
    if have != cores:
        where = (lambda c: f"groups sharing {c} CPU cores" if c else "a device per group")
        raise ValueError(f"--selector {path}: labelled for {where(have)}; this job runs "
                         f"{where(cores)} ({train})")


def spares_for(spec: JobSpec, faults: list[Fault]) -> int:
    """Warm spares started with the job, one per fault that takes a process away: they import
    and build the model *before* step 0, so on a small machine their start-up does not slow
    training the way a late one does."""
    if spec.ft.spares is not None:
        return spec.ft.spares
    if spec.ft.standby_p is not None:  # byterobust §8: the P99 of Binomial(groups, p)
        from unbroken.core.standby import standby_size

        return standby_size(spec.groups, spec.ft.standby_p)
    per_node = -(-spec.groups // max(1, spec.local_nodes))  # a node fault takes a node's groups
    need = max(1, sum(1 for f in faults if f.kind in REMOVING or f.kind == "xid")
               + per_node * sum(1 for f in faults if f.kind in NODE_KINDS))
    if spec.chaos_faults is not None:  # a soak: a few warm, the rest started as they go (a
        return min(need, max(2, spec.groups // 4))  # process each at once would not fit)
    return need


def train_config(spec: JobSpec, sdc_every: int = 0):
    """The workers' configuration (``runtime.config.TrainConfig``) for this job. For the
    built-in GPT its own settings (the demo's) come first in ``trainer_args``, and the job's
    ``trainer_args`` override them."""
    from unbroken.runtime.config import TrainConfig
    from unbroken.runtime.stragglers import normalize_spec

    args = dict(spec.trainer_args)
    if spec.trainer == "gpt":
        from unbroken.runtime.gpt import RECOMMENDED_LR

        args = {"lr": RECOMMENDED_LR, "dataset_size": 8192, **args}
    return TrainConfig(groups=spec.groups, redundancy=spec.ft.redundancy, steps=spec.steps,
                       seed=spec.seed, model=spec.trainer, trainer_args=args,
                       shard_size=spec.shard_size, sdc_every=sdc_every,
                       stragglers=normalize_spec(spec.stragglers), sync=spec.sync,
                       selector=None if spec.selector is None
                       else str(Path(spec.selector).resolve()),
                       host_cores=_host_cores(spec), ranks_per_group=spec.ranks_per_group,
                       shard=spec.shard, device=spec.device)


def _host_cores(spec: JobSpec) -> int:
    """The cores the groups share when this machine runs them all (the supervisor's own
    workers, or ``--local-nodes`` agents): ``core.sync.shared_cores``; 0 with agents elsewhere
    (a machine each) and under ``sync`` (nothing prices modes)."""
    import os

    from unbroken.core.sync import shared_cores

    if spec.sync == "sync" or spec.nodes:
        return 0
    return shared_cores(spec.groups, len(os.sched_getaffinity(0)))


def load_trainer(cfg):
    """Build the trainer once here, as every worker will; any failure is a TrainerError naming
    the trainer and what went wrong (one line)."""
    name = cfg.model
    import os
    import sys

    if os.getcwd() not in sys.path:  # as ``python -m`` does for the workers: a trainer
        sys.path.insert(0, os.getcwd())  # module in the current directory imports here too
    if name not in ("gpt", "mlp"):
        mod, sep, fn = name.partition(":")
        if not sep or not mod or not fn:
            raise TrainerError(f"--trainer {name!r}: expected 'package.module:factory'")
        try:
            factory = getattr(importlib.import_module(mod), fn)
        except ImportError as exc:
            raise TrainerError(f"--trainer {name!r}: cannot import {mod!r} ({exc})") from None
        except AttributeError:
            raise TrainerError(f"--trainer {name!r}: module {mod!r} has no {fn!r}") from None
        if not callable(factory):
            raise TrainerError(f"--trainer {name!r}: {fn!r} is not callable")
    from unbroken.runtime.trainer import make_trainer

    try:
        tr = make_trainer(cfg)
    except Exception as exc:  # the user's code: any error is theirs to see, in one line
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise TrainerError(f"--trainer {name!r}: the factory raised {type(exc).__name__}"
                           f"{': ' + msg if msg else ''}") from None
    missing = [a for a in _TRAINER_API if not hasattr(tr, a)]
    if missing:
        raise TrainerError(f"--trainer {name!r}: the factory returned a "
                           f"{type(tr).__name__}, not a trainer (no {', '.join(missing)}); "
                           f"return a unbroken.ModuleTrainer or a TrainerLike")
    return tr
