"""Fault injection at deterministic points of a group's own step, as wrappers around the real
components (the runner holds no fault code):

* :class:`FaultyTrainer` - a ``TrainerLike`` around the real trainer: one NaN at a step, a
  flipped mantissa bit from a step on (silent data corruption), a slower gradient from a step on
  (a straggler), or a straggler trace's factor per step (``--stragglers``);
* :class:`DropCommit` - a communicator around ``FTComm``: the step's completed all-reduce is
  treated as failed once on this rank (its peers commit), at a step or at the commit that makes
  the peers admit a spare;
* :class:`SelfFaults` - the runner's :class:`~unbroken.runtime.stacked.StepHooks`: the process
  SIGKILLs / SIGSTOPs itself at an exact point (so the step is exact), blocks for good in "user
  code", serves a corrupt snapshot; it wraps every trainer the runner builds (a hot update too);
* :class:`FaultSpec` / :func:`build` - one process's faults -> (comm wrapper, hooks);
* :func:`install` - the worker's plug-in (``--plugin unbroken.testing.faults:install
  --plugin-args JSON``, a :class:`~unbroken.runtime.hooks.Plugin`): the launcher names it only
  when a run asks for faults or a straggler trace, so a plain run never imports this module.

Every fault journals a ``fault`` event (kind, group, uid, step); a process fault first calls
``on_fault(kind)`` (the worker posts ``killed/<uid>`` / ``stopped/<uid>``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, NamedTuple

import torch

from unbroken.events import Event
from unbroken.protocol import drill_key, killed_key, stopped_key
from unbroken.runtime.hooks import StepHooks
from unbroken.runtime.stepbuf import joins_reported
from unbroken.runtime.trainer import TrainerLike, grad_into

__all__ = ["TrainerProxy", "GradFaults", "FaultyTrainer", "DropCommit", "SelfFaults", "Faults",
           "FaultSpec", "build", "install", "FaultPlugin", "fault_event"]


def fault_event(runner: Any, kind: str, step: int | None = None, at: int | None = None) -> dict:
    """The journal's ``fault`` event for this group (at the runner's step unless given); ``at``:
    the step the schedule named, when it fires later (a replacement that joined after it)."""
    step = runner.step if step is None else step
    return {"event": Event.FAULT, "kind": kind, "group": runner.my_slot, "uid": runner.uid,
            "step": step, "at": step if at is None else at, "t": time.time()}


def due(at: int | None, step: int) -> bool:
    """A scheduled fault fires at its step, or at the first step its process runs after it (a
    slot's replacement that joined late)."""
    return at is not None and step >= at


@dataclass
class GradFaults:
    """Numeric and straggler faults of a group's gradients, with what has fired (shared by the
    wrappers of successive trainers: a hot update does not reset them)."""

    nan_at: int | None = None     # one NaN in the first gradient of step K (or the first
    #                               step after it), once
    flip_from: int | None = None  # from step K on, one flipped mantissa bit in every gradient
    slow_from: int | None = None  # from step K on, every gradient takes twice as long, and
    #                               at least slow_s longer
    slow_s: float = 0.06
    # a straggler trace's factor per step for this process (``--stragglers``): a gradient at
    # step s takes slowdown[s] times its measured compute (None: never slowed)
    slowdown: list[float] | None = None
    # not a fault: every gradient takes at least this long (a sleep, nothing is told), so a
    # test's job lasts the wall time it needs without keeping the machine's cores busy
    pace_s: float = 0.0
    told: set[tuple[str, int]] = field(default_factory=set)
    slow_told: bool = False
    flip_told: bool = False
    nan_next: list[int] = field(default_factory=list)  # a slot's further NaNs, in step order

    def any(self) -> bool:
        return not (self.nan_at is None and self.flip_from is None and self.slow_from is None
                    and self.slowdown is None and self.pace_s <= 0)


class TrainerProxy:
    """A ``TrainerLike`` that delegates everything to ``inner`` (subclasses change ``grad``)."""

    def __init__(self, inner: TrainerLike) -> None:
        self.inner = inner

    @property
    def numel(self) -> int:
        return self.inner.numel

    @property
    def last_loss(self) -> dict[int, float]:
        return self.inner.last_loss

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def grad(self, step: int, shard_type: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return grad_into(self.inner, step, shard_type, out)

    def apply(self, total: torch.Tensor) -> None:
        self.inner.apply(total)

    def flat_params(self) -> torch.Tensor:
        return self.inner.flat_params()

    def state_tensors(self) -> list[torch.Tensor]:
        return self.inner.state_tensors()


class FaultyTrainer(TrainerProxy):
    """A ``TrainerLike`` that delegates to ``inner`` and corrupts or slows ``grad(step, t)``;
    ``tell(kind, step)`` journals the fault (the caller knows the group's slot and uid)."""

    def __init__(self, inner: TrainerLike, faults: GradFaults,
                 tell: Callable[[str, int, int], None]) -> None:
        super().__init__(inner)
        self.faults, self.tell = faults, tell

    def _told(self, kind: str, step: int, at: int) -> None:
        if (kind, step) not in self.faults.told:
            self.faults.told.add((kind, step))
            self.tell(kind, step, at)

    def grad(self, step: int, shard_type: int, out: torch.Tensor | None = None) -> torch.Tensor:
        f = self.faults
        t0 = time.perf_counter()
        g = grad_into(self.inner, step, shard_type, out)
        compute = time.perf_counter() - t0
        factor = f.slowdown[step] if f.slowdown is not None and step < len(f.slowdown) else 1.0
        if f.nan_at is not None or f.flip_from is not None:
            i = int(g.abs().argmax())  # the largest element: a parameter the data really uses
            if due(f.nan_at, step):
                at, f.nan_at = f.nan_at, (f.nan_next.pop(0) if f.nan_next else None)
                self._told("nan", step, at)
                g = g.clone()
                g[i] = float("nan")
            if due(f.flip_from, step):
                if not f.flip_told:
                    f.flip_told = True
                    self._told("flip", step, f.flip_from)
                g = g.clone()
                bits = g[i:i + 1].view(torch.int64)
                bits ^= 1 << 44  # a mantissa bit: the value moves by ~0.4 %, finite, and the
                #                  loss does not show it
        extra = 0.0
        if due(f.slow_from, step):
            if not f.slow_told:
                f.slow_told = True
                self.tell("slow", step, f.slow_from)
            # the slow fault: twice as slow, at least slow_s more (a fixed delay alone would
            # vanish in the step of a big job: fail-slow compares with the peers' median)
            factor = max(factor, 2.0)
            extra = f.slow_s
        delay = f.pace_s - compute
        if factor > 1.0:
            # a machine F times slower: (F - 1) x this gradient's own measured compute, as a
            # sleep, not a busy loop: a slower node is slow on its own core, and spinning here
            # would take CPU from the other groups sharing this machine's cores (their steps
            # would slow too and the injected ratio would not be the one asked for)
            delay = max(delay, extra, (factor - 1.0) * compute)
        if delay > 0:
            time.sleep(delay)
        return g


class DropCommit:
    """A communicator around ``inner`` (an ``FTComm``): the step's all-reduce, once it completed,
    is reported as failed once (``inner.fail``, so the generation re-forms while the peers have
    committed): at step ``at``, or (``on_join``) at the commit whose reduced buffer reports more
    joins than the runner admitted. The runner's ``before_allreduce`` hook ``arm``s it with the
    step and the admitted count, so only the step's op is ever dropped.

    ``peers_journal``: the job's journal directory. It then fails the op only once every
    peer journaled its commit of that step: the scenario is "the peers committed,
    this rank did not". Failing at once could catch a peer still receiving the op's last
    chunks on a loaded machine, and then nobody committed (no roll forward to test).

    ``hold_s``: then wait up to that long for the coordinator's store to go (``store_lost``,
    a supervisor SIGKILLed meanwhile) before failing: the race of a peer dying mid-all-reduce
    with the supervisor, where this member re-attaches one commit behind the others
    (``core.coordination.adoption``). The peers wait for it in their next op meanwhile."""

    _OWN = frozenset({"inner", "at", "on_join", "_armed", "peers_journal", "hold_s"})
    PEERS_WAIT_S = 30.0

    def __init__(self, inner: Any, at: int | None = None, on_join: bool = False,
                 peers_journal: str | None = None, hold_s: float = 0.0) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "on_join", on_join)
        object.__setattr__(self, "_armed", None)
        object.__setattr__(self, "peers_journal", peers_journal)
        object.__setattr__(self, "hold_s", float(hold_s))

    def _peers_committed(self, step: int) -> None:
        """Block until each peer's journal holds its commit of ``step`` (or the wait's end)."""
        import json
        import os
        import time

        def committed(u: int) -> bool:
            try:
                with open(os.path.join(self.peers_journal, f"group-{u}.jsonl")) as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                return False
            for x in lines:
                try:
                    e = json.loads(x)
                except ValueError:
                    continue  # a line still being written
                if e.get("event") == "commit" and e.get("step") == step:
                    return True
            return False

        peers = [u for u in self.inner.members if u != self.inner.uid]
        deadline = time.monotonic() + self.PEERS_WAIT_S
        while peers and time.monotonic() < deadline:
            peers = [u for u in peers if not committed(u)]
            if peers:
                time.sleep(0.01)  # polls a condition (the peers' journals), bounded above

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:  # store_lost, on_issue: the real one
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def arm(self, step: int, admitted: int) -> None:
        self._armed = (step, admitted)

    def allreduce(self, tensor: torch.Tensor) -> bool:
        armed, self._armed = self._armed, None
        ok = self.inner.allreduce(tensor)
        if ok and armed is not None and (armed[0] == self.at or (
                self.on_join and joins_reported(tensor) > armed[1])):
            if self.peers_journal is not None:
                self._peers_committed(armed[0])
            if self.hold_s > 0 and armed[0] == self.at:
                deadline = time.monotonic() + self.hold_s
                while not self.inner.store_lost and time.monotonic() < deadline:
                    time.sleep(0.01)  # polls a condition (the heartbeat's verdict), bounded
            self.at, self.on_join = None, False  # this rank saw the op fail; its peers committed
            self.inner.fail("injected: completed all-reduce treated as failed")
            return False
        return ok


@dataclass
class SelfFaults(StepHooks):
    """The runner's hooks that make the process fault itself at exact points."""

    die_at: int | None = None       # SIGKILL after the step's gradients, before its all-reduce
    stop_at: int | None = None      # SIGSTOP at the same point (a hang)
    stall_at: int | None = None     # the main thread blocks for good at step K while the
    #                                 heartbeat thread beats on (a user-code deadlock)
    die_in_patch: bool = False      # SIGKILL after the first replan, before the patch compute
    die_after_replan: bool = False  # SIGKILL after the first replan's patch compute
    die_in_retry: bool = False      # SIGKILL inside the first retried all-reduce
    corrupt_snapshot: bool = False  # serve a snapshot with one flipped element (once)
    grads: GradFaults | None = None
    comm: DropCommit | None = None
    on_fault: Callable[[str], None] = lambda kind: None

    # ------------------------------------------------------------------ the hooks
    def wrap_trainer(self, runner: Any, trainer: TrainerLike) -> TrainerLike:
        if self.grads is None or not self.grads.any():
            return trainer
        if isinstance(trainer, FaultyTrainer):
            return trainer
        return FaultyTrainer(trainer, self.grads, lambda kind, step, at: runner.journal(
            fault_event(runner, kind, step, at)))

    def load(self, drill: list[tuple[str, int]], slow_s: float = 0.06) -> bool:
        """Take on a slot's scheduled faults (``core.faults.holder_faults``: kind, step): a
        worker from its ``--drill`` flag, a spare when it is assigned the slot. True when they
        include gradient faults (a trainer built before must be wrapped: ``wrap_trainer``)."""
        at = {kind: int(step) for kind, step in reversed(drill)}  # the earliest of a kind
        self.die_at, self.stop_at, self.stall_at = at.get("kill"), at.get("hang"), at.get("stall")
        if {"nan", "flip", "slow"} & set(at):
            g = self.grads = self.grads or GradFaults(slow_s=slow_s)
            g.flip_from, g.slow_from = at.get("flip"), at.get("slow")
            nans = sorted(int(step) for kind, step in drill if kind == "nan")
            g.nan_at, g.nan_next = (nans[0], nans[1:]) if nans else (None, [])
            return True
        return False

    def step_ready(self, runner: Any) -> None:
        step = runner.step
        if due(self.die_at, step):
            self.fault(runner, "kill", self.die_at)
        if due(self.stop_at, step):
            self.fault(runner, "hang", self.stop_at)
        if due(self.stall_at, step):
            runner.journal(fault_event(runner, "stall", at=self.stall_at))
            stuck_in_user_code()

    def before_allreduce(self, runner: Any) -> None:
        if self.comm is not None:
            self.comm.arm(runner.step, runner.admitted)

    def before_patch(self, runner: Any) -> None:
        if self.die_in_patch:
            self.fault(runner, "kill")

    def after_replan(self, runner: Any, plan: Any) -> None:
        if not plan.patch:  # a replan that moved work (not a spurious re-form)
            return
        if self.die_after_replan:
            self.fault(runner, "kill")
        if self.die_in_retry:
            self.die_in_retry = False
            self.announce(runner, "kill")  # before the op: between its issue and the kill there
            #                                is no time for the op to complete on the peers
            runner.comm.on_issue = lambda: os.kill(os.getpid(), signal.SIGKILL)

    def state_payload(self, runner: Any, payload: torch.Tensor) -> torch.Tensor:
        if self.corrupt_snapshot:
            self.corrupt_snapshot = False
            payload[0] = (int(payload[0]) + 1) % 256  # one flipped byte
        return payload

    # ------------------------------------------------------------------ process faults
    def announce(self, runner: Any, kind: str, at: int | None = None) -> None:
        runner.journal(fault_event(runner, kind, at=at))
        self.on_fault(kind)

    def fault(self, runner: Any, kind: str, at: int | None = None) -> None:
        self.announce(runner, kind, at)
        os.kill(os.getpid(), signal.SIGSTOP if kind == "hang" else signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # continued after a hang: leave, we were evicted


def stuck_in_user_code() -> None:
    """The injected stall: blocks forever without holding the GIL, so the heartbeat thread
    keeps the group looking alive; only its stack shows where it is."""
    threading.Event().wait()


class Faults(NamedTuple):
    """What a worker runs with: ``comm(real)`` -> the communicator to give the runner, and the
    runner's ``hooks`` (which also wrap its trainers)."""

    comm: Callable[[Any], Any]
    hooks: StepHooks


@dataclass
class FaultSpec:
    """One process's faults, as its launcher asks for them (``--plugin-args``)."""

    die_at: int | None = None
    stop_at: int | None = None
    stall_at: int | None = None
    die_in_patch: bool = False
    die_after_replan: bool = False
    die_in_retry: bool = False
    corrupt_snapshot: bool = False
    drop_commit_at: int | None = None
    peers_journal: str | None = None  # a dropped commit waits for the peers' commits there
    drop_commit_hold_s: float = 0.0  # ... and then up to this long for the store to go
    drop_commit_on_join: bool = False
    slow_from: int | None = None    # from this step on, every gradient takes slow_s longer
    slow_s: float = 0.06
    pace_s: float = 0.0  # every gradient takes at least this long (``GradFaults.pace_s``)
    nan_at: int | None = None
    flip_from: int | None = None
    # the slot's scheduled faults, [(kind, step), ...] (core.faults.holder_faults); a spare
    # gets its own with the assignment (``drill/<uid>``)
    drill: list[tuple[str, int]] = field(default_factory=list)
    rank: int = 0  # this process's rank in its group: a slot's scheduled faults go to rank 0

    @classmethod
    def from_args(cls, args: dict) -> FaultSpec:
        known = {f.name for f in fields(cls)}
        bad = sorted(set(args) - known)
        if bad:
            raise ValueError(f"--plugin-args: unknown fault {bad[0]!r} (known: "
                             f"{', '.join(sorted(known))})")
        return cls(**args)


def build(spec: FaultSpec, on_fault: Callable[[str], None],
          slowdown: list[float] | None = None) -> Faults:
    """One process's faults and its straggler factors per step (``slowdown``, None: none)
    -> the wrappers."""
    grads = GradFaults(nan_at=spec.nan_at, flip_from=spec.flip_from, slow_from=spec.slow_from,
                       slow_s=spec.slow_s, slowdown=slowdown, pace_s=spec.pace_s)
    drops = spec.drop_commit_at is not None or spec.drop_commit_on_join
    hooks = SelfFaults(die_at=spec.die_at, stop_at=spec.stop_at, stall_at=spec.stall_at,
                       die_in_patch=spec.die_in_patch, die_after_replan=spec.die_after_replan,
                       die_in_retry=spec.die_in_retry, corrupt_snapshot=spec.corrupt_snapshot,
                       grads=grads if grads.any() else None, on_fault=on_fault)
    if spec.drill:
        hooks.load(spec.drill, spec.slow_s)

    def comm(real: Any) -> Any:
        if not drops:
            return real
        hooks.comm = DropCommit(real, at=spec.drop_commit_at, on_join=spec.drop_commit_on_join,
                                peers_journal=spec.peers_journal,
                                hold_s=spec.drop_commit_hold_s)
        return hooks.comm

    return Faults(comm, hooks)


class FaultPlugin:
    """The worker's plug-in (:class:`~unbroken.runtime.hooks.Plugin`): a process fault first
    posts ``killed/<uid>`` / ``stopped/<uid>`` (wall time) in the job's store, so the launcher
    tells an injected death from a real one; a spare takes its slot's faults when assigned."""

    def __init__(self, spec: FaultSpec, uid: int, slowdown: list[float] | None) -> None:
        self.uid, self.slow_s, self.rank = uid, spec.slow_s, spec.rank
        self.store: Any = None
        self.faults = build(spec, self._posted, slowdown)
        self.hooks = self.faults.hooks

    def _posted(self, kind: str) -> None:
        self.store.set((stopped_key if kind == "hang" else killed_key)(self.uid),
                       repr(time.time()))

    def wrap_comm(self, comm: Any) -> Any:
        self.store = comm.store
        return self.faults.comm(comm)

    def assigned(self, runner: Any) -> None:
        if self.rank == 0 and self.store.check([drill_key(self.uid)]):  # the slot's next scheduled faults
            if self.hooks.load(json.loads(self.store.get(drill_key(self.uid))), self.slow_s):
                runner.trainer = self.hooks.wrap_trainer(runner, runner.trainer)


def install(args: dict, uid: int, cfg: Any) -> FaultPlugin:
    """The plug-in factory: ``args`` a :class:`FaultSpec` as JSON; a straggler trace in the
    config (``--stragglers``) slows this process per step."""
    slowdown = None
    if cfg.stragglers is not None:
        from unbroken.runtime.stragglers import own_slowdowns

        # keyed by the uid: a straggler is a slow machine, so a spare that takes over the
        # slot runs at full speed (see unbroken.core.stragglers)
        slowdown = own_slowdowns(cfg.stragglers, uid, cfg.groups, cfg.steps, cfg.seed)
    return FaultPlugin(FaultSpec.from_args(args), uid, slowdown)


# ``supervise.launch.TEST_FAULTS_ENV``, the launcher's test hook: a JSON object of
# ``StackedCluster`` fault arguments (``{"drop_commit_at": {"2": 300}, "drop_commit_hold_s":
# 20}``) for the local clusters a supervisor starts (not a standby's, not under node
# agents) -- faults the ``--faults``
# schedule has no kind for, injected into a whole ``unbroken run`` (its supervisor, etcd, a
# standby) by a test
_CLUSTER_FAULTS = {"die_at", "stop_at", "drop_commit_at", "slow_from", "stall_at", "nan_at",
                   "flip_from", "drop_commit_hold_s", "pace_s"}
_NUMBERS = {"drop_commit_hold_s", "pace_s"}  # the others: uid -> step


def cluster_faults(text: str, name: str = "UNBROKEN_TEST_FAULTS") -> dict:
    """The value of environment variable ``name`` -> the cluster's keyword arguments (uid
    keys as ints); ``ValueError`` with one line naming the bad part."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: not JSON") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{name}={text!r}: expected a JSON object")
    out: dict = {}
    for key, value in raw.items():
        if key not in _CLUSTER_FAULTS:
            raise ValueError(f"{name}: unknown fault {key!r} (known: "
                             f"{', '.join(sorted(_CLUSTER_FAULTS))})")
        try:
            out[key] = (float(value) if key in _NUMBERS
                        else {int(u): int(step) for u, step in value.items()})
        except (TypeError, ValueError, AttributeError):
            raise ValueError(f"{name}: {key}={value!r} is not "
                             + ("a number" if key in _NUMBERS
                                else "an object of uid -> step")) from None
    return out
