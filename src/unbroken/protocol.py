"""The contract between the supervisor and its workers: exit codes and the store keys.

Why one file: an exit code is read by a process that did not write it (the supervisor reads a
worker's, a shell script or a scheduler reads the supervisor's), and a store key is written in
one process and waited on in another. Defined here once, both sides agree by construction.

Exit codes (a worker's and the ``unbroken`` command's; the command adds 1, 2 and 7):

====  ==================  ==============================================================
0     OK                  finished every step
1     FAILED              the run could not finish (a worker error, no survivor)
2     USAGE               bad input: one line naming it, nothing started
3     WORKER_ERROR        a worker raised (its traceback is in ``error/<uid>``)
4     WIPEOUT             a wipe-out no spare could cover (the supervisor restarts the job)
5     COORDINATOR_LOST    the store or the supervisor went silent: every member stopped after
                          the same committed step and a checkpoint of it was written;
                          ``--resume`` continues
6     NO_PROGRESS         the guard's ladder gave up (``core.ladder`` decides it)
7     NO_RESUME_POINT     ``--resume`` found no valid checkpoint (or no previous run at all)
8     STOPPED             stopped on request (SIGINT/SIGTERM to the supervisor): every member
                          stopped after the same committed step, a checkpoint was written
10    FENCED              a node agent the coordinator declared lost (cut off: its heartbeat
                          went stale): it killed every process it started and left
11    GROUP_FENCED        a rank of a group of several whose sibling rank went silent: it
                          declared the group dead and left (the group is replaced whole)
130   INTERRUPTED         the ``unbroken`` command after Ctrl-C (128 + SIGINT), state saved
143   TERMINATED          the ``unbroken`` command after SIGTERM (128 + SIGTERM), state saved
====  ==================  ==============================================================
"""

from __future__ import annotations

import enum

__all__ = ["ExitCode", "SUPERVISOR_HB", "STOP_KEY", "JOIN_COUNT", "CODE_COUNT", "DEAD_EPOCH",
           "COORD_EPOCH", "ADOPTED", "reattach_key", "exit_key",
           "plane_ns", "group_pg_prefix", "hb_key", "dead_key", "done_key", "error_key", "killed_key", "stopped_key",
           "standby_key", "assign_key", "drill_key", "join_key", "admit_key", "state_key", "wipeout_key",
           "wipeout_failed_key", "code_key", "incident_key", "verdict_key", "replay_key",
           "NODE_EXITS", "node_key", "node_hb_key", "node_fenced_key", "node_order_key",
           "node_orders_key", "node_exit_key", "node_pid_key", "node_left_key", "node_error_key",
           "node_stacks_key", "node_rejoin_key", "node_health_key", "node_xids_key", "node_xid_key", "JOB_NODES", "JOB_ATTEMPTS", "job_attempt_key"]


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    WORKER_ERROR = 3
    WIPEOUT = 4
    COORDINATOR_LOST = 5
    NO_PROGRESS = 6
    NO_RESUME_POINT = 7
    STOPPED = 8
    JOIN_FAILED = 9  # left out of a generation (a spare's admission broke, or the members
    #                  re-formed without this one): the launcher treats it as lost
    FENCED = 10  # a node agent declared lost by the coordinator (``unbroken.nodes``)
    GROUP_FENCED = 11  # a rank whose sibling rank (same group) went silent: it declared its
    #                    group dead and left; the launcher replaces the whole group
    INTERRUPTED = 130
    TERMINATED = 143


#: the supervisor's heartbeat counter: bumped every ``heartbeat`` seconds by a thread of the
#: supervisor; members treat it going stale like the store going away (exit 5 with a checkpoint)
SUPERVISOR_HB = "hb/supervisor"

#: set by the supervisor on SIGINT/SIGTERM; rank 0 reads it into the step buffer so every member
#: stops after the same committed step (exit 8)
STOP_KEY = "ctl/stop"


# -- store keys -----------------------------------------------------------------------------
# One function per key family; the strings are the wire format (byte-identical to what every
# version of the runtime wrote). ftcomm's own keys (``rdzv/`` and ``pg/`` in ftcomm_rendezvous,
# ``abort/`` and ``bell/`` in ftcomm_heartbeat) and the probe worker's (``result/``,
# ``first/``, ``stop``) stay private to their modules: each is formatted in that one file.
# ``hb/`` and ``dead/`` live here because other modules share them (``hb/supervisor`` is in the
# same namespace; the supervisor posts ``dead/`` through ``ftcomm.declare_dead`` and the
# runner's admission reads it).

#: counter of join records (``join_key``): a joiner bumps it; rank 0 reads it into the step buffer
JOIN_COUNT = "join/count"

#: counter of code records (``code_key``): the supervisor bumps it after posting a record; rank 0
#: reads it into the step buffer so every member hot-swaps at one step boundary
CODE_COUNT = "code/count"

#: bumped by ``ftcomm.declare_dead`` with each death notice; ftcomm's watcher waits on it
DEAD_EPOCH = "dead/epoch"

#: the epoch of this store (``--store etcd://``): its supervisor sets it once, and publishes it
#: with the store's address in etcd; a worker whose store went away re-attaches to a store of
#: another epoch (``runtime.reattach``)
COORD_EPOCH = "coord/epoch"

#: set by a standby supervisor once it adopted the running members that re-attached to its
#: store: they train on (``runtime.reattach``)
ADOPTED = "coord/adopted"  # the standby's go: JSON list of the uids it adopted


def plane_ns(rank: int) -> str:
    """The key namespace of a group's rank ``rank``: its communicator (heartbeat, abort flag,
    rendezvous, process groups, doorbell) talks to rank ``rank`` of the other groups, apart
    from the other ranks' (``""`` for rank 0: a group of one rank keeps today's keys). Death
    notices, the supervisor's keys and the control counters are shared by every rank."""
    return f"p{rank}/" if rank else ""


def rank_proc(uid: int, rank: int, ranks: int) -> int | str:
    """The launcher's key for rank ``rank`` of group ``uid`` (its ``procs``, stderr file and a
    node agent's records): the uid itself for a group of one rank, ``"<uid>.<rank>"`` else."""
    return uid if ranks == 1 else f"{uid}.{rank}"


def group_of(key: int | str) -> int:
    """The group uid of a launcher key (:func:`rank_proc`)."""
    return key if isinstance(key, int) else int(str(key).split(".")[0])


def group_pg_prefix(uid: int) -> str:
    """The store prefix of group ``uid``'s own process group (its ranks, torch's default group
    in each of them; a spare group forms its own under its uid)."""
    return f"grp/{uid}/"


def hb_key(uid: int, ns: str = "") -> str:
    """A member's heartbeat counter: ftcomm's heartbeat thread bumps it; peers' watchers read
    it (``ns``: the rank's plane, :func:`plane_ns`)."""
    return f"{ns}hb/{uid}"


def dead_key(uid: int) -> str:
    """Death notice: the supervisor posts it (``ftcomm.declare_dead``); ftcomm's watcher, the
    rendezvous and the runner's admission (a dead joiner) read it."""
    return f"dead/{uid}"


def done_key(uid: int) -> str:
    """A worker's final record (JSON): the worker writes it, the supervisor / cluster reads it."""
    return f"done/{uid}"


def reattach_key(uid: int, rank: int = 0) -> str:
    """A member's report after re-attaching to a standby's store (JSON: pid, slot, step,
    generation, members): the worker writes it (each rank of a group its own), the standby
    adopts from it."""
    return f"reattach/{uid}" if rank == 0 else f"reattach/{uid}.{rank}"


def exit_key(uid: int, rank: int = 0) -> str:
    """A worker's exit code (rank ``rank`` of its group), written just before it exits: a
    supervisor that adopted it (not its parent, so no ``waitpid``) reads it; absent after a
    kill."""
    return f"exit/{uid}" if rank == 0 else f"exit/{uid}.{rank}"


def error_key(uid: int) -> str:
    """A worker's traceback: the worker writes it before exit 3; the supervisor / cluster reads."""
    return f"error/{uid}"


def killed_key(uid: int) -> str:
    """Wall time just before a self-inflicted SIGKILL (fault injection); tests and bench read it."""
    return f"killed/{uid}"


def stopped_key(uid: int) -> str:
    """Wall time just before a self-inflicted SIGSTOP (fault injection); tests read it."""
    return f"stopped/{uid}"


def standby_key(uid: int) -> str:
    """A warm spare's "ready": the spare writes it once its model is built; nobody waits on it."""
    return f"standby/{uid}"


def assign_key(uid: int) -> str:
    """The layout slot a spare takes over: the supervisor / cluster writes it; the spare waits."""
    return f"assign/{uid}"


def drill_key(uid: int) -> str:
    """A fire drill's faults for a spare's slot (JSON ``[[kind, step], ...]``), written before
    ``assign_key``: the spare injects them as the slot's next holder."""
    return f"drill/{uid}"


def join_key(n: int) -> str:
    """Join record ``n`` (1-based, ``{"uid", "slot"}``): a joiner writes it; rank 0 reads it."""
    return f"join/{n}"


def admit_key(uid: int, ns: str = "") -> str:
    """Admission of joiner ``uid`` (``{"gen", "joiners"}``): rank 0 writes it, the joiner waits
    (``ns``: the plane whose generation it names, :func:`plane_ns`)."""
    return f"{ns}admit/{uid}"


def state_key(gen: int, src: int, ns: str = "") -> str:
    """State-copy metadata of generation ``gen`` from slot ``src``: donor writes, joiners read
    (``ns``: the plane, each carries its own shard of the state)."""
    return f"{ns}state/{gen}/{src}"


def wipeout_key(uid: int) -> str:
    """A wipe-out survivor waiting for replacements (``{"step", "dead_slots"}``): the survivor
    writes it; tests read it (the supervisor learns of it from the journal)."""
    return f"wipeout/{uid}"


def wipeout_failed_key(uid: int) -> str:
    """Why no replacement came (exit 4): the survivor writes it; tests read it."""
    return f"wipeout_failed/{uid}"


def code_key(n: int) -> str:
    """Code record ``n``: the supervisor (guard's ``PostCode``) writes it; every member reads it."""
    return f"code/{n}"


def incident_key(step: int, n: int) -> str:
    """Runtime incident ``n`` at ``step``: rank 0 writes it; tests playing the guard read it."""
    return f"incident/{step}/{n}"


def verdict_key(step: int, n: int) -> str:
    """The guard's verdict on incident ``n`` at ``step``: the supervisor writes it (guard's
    ``PostVerdict``); every member waits on it."""
    return f"verdict/{step}/{n}"


def replay_key(step: int, n: int) -> str:
    """A replay's digests for incident ``n`` at ``step``: rank 0 writes it; tests read it."""
    return f"replay/{step}/{n}"


# -- node agents (``unbroken.nodes``): one agent per machine, the coordinator hosts the store --
# Two stores: the job's *directory* (``nodes.directory``, the address agents are given; it
# lives as long as the job) holds the claims, the fences and the attempts; each attempt's own
# store (new after a wipe-out restart) holds the rest. ``node_key`` and ``node_fenced_key``
# are written to both.

#: the job's node count, in the directory (an agent with a higher index leaves: exit 2)
JOB_NODES = "job/nodes"

#: counter of the job's attempts, in the directory: each attempt bumps it after it wrote
#: ``job_attempt_key``; the agents watch it
JOB_ATTEMPTS = "job/attempts"


def job_attempt_key(n: int) -> str:
    """Attempt ``n`` (1-based), in the directory, JSON: ``{"port", "out"}`` (the attempt's
    store on the directory's host; the run directory every node must see) or
    ``{"end": true}`` (the job is over: agents exit 0)."""
    return f"job/attempt/{n}"


def node_error_key(i: int) -> str:
    """Agent ``i``'s one-line refusal (it cannot run the job: the run directory is not
    visible there, its slots do not fit the placement), in the directory; it exits 2."""
    return f"node_error/{i}"


def node_rejoin_key(i: int) -> str:
    """Set by fenced agent ``i`` (``--rejoin``) in the directory once it killed what it ran:
    it offers its node again. The coordinator lifts the fence (deletes ``node_fenced_key``)
    when its heartbeat moves again (``core.nodes.rejoining``) and deletes this key."""
    return f"node_rejoin/{i}"


def node_left_key(i: int) -> str:
    """Set by agent ``i`` in an attempt's store once it carried out ``{"op": "exit"}`` (its
    workers killed and reaped): the attempt may close its store."""
    return f"node_left/{i}"


def node_health_key(i: int) -> str:
    """Node ``i``'s latest machine sample (JSON: ``nodes.health.sample_node``), rewritten by
    its agent every second in the attempt's store; the coordinator journals it."""
    return f"node_health/{i}"


def node_xids_key(i: int) -> str:
    """How many XID records node ``i``'s agent has posted (``node_xid_key``)."""
    return f"node_xids/{i}"


def node_xid_key(i: int, n: int) -> str:
    """XID record ``n`` (1-based) of node ``i`` (JSON ``{"uid", "code", "action", "reason",
    "pci", "pid"}``): a line of that node's kernel log, the pid mapped to the worker by its
    own agent (pids are only unique on one machine)."""
    return f"node_xid/{i}/{n}"


def node_stacks_key(uid: int, n: int) -> str:
    """The stacks of worker ``uid`` for dump order ``n`` (JSON ``{"ok", "text"}``), written
    by its node's agent (py-spy on its own worker)."""
    return f"node_stacks/{uid}/{n}"

#: bumped by an agent after each ``node_exit_key`` it posts; the coordinator's watcher reads it
NODE_EXITS = "node/exits"


def node_key(i: int) -> str:
    """Node ``i``'s claim (JSON ``{"pid", "host", "slots", "spares"}``): the agent writes it
    with ``compare_set`` (a second agent for the same index fails: exit 2); the coordinator
    waits on it."""
    return f"node/{i}"


def node_hb_key(i: int) -> str:
    """Node ``i``'s heartbeat counter: the agent's heartbeat thread bumps it; the coordinator
    judges it like a member's (``core.nodes.stale_nodes``)."""
    return f"node_hb/{i}"


def node_fenced_key(i: int) -> str:
    """Set by the coordinator when it declared node ``i`` lost: an agent that wakes up to it
    kills what it started and exits 10 (``ExitCode.FENCED``)."""
    return f"node_fenced/{i}"


def node_orders_key(i: int) -> str:
    """Counter of orders posted to node ``i``: the coordinator bumps it after writing
    ``node_order_key``; the agent reads it."""
    return f"node_orders/{i}"


def node_order_key(i: int, n: int) -> str:
    """Order ``n`` (1-based) to node ``i``'s agent, JSON: ``{"op": "spawn", "uid", "argv"}``,
    ``{"op": "signal", "uid", "sig"}``, ``{"op": "dump", "uid"}`` or ``{"op": "exit"}``."""
    return f"node_order/{i}/{n}"


def node_exit_key(uid: int) -> str:
    """Exit code of worker ``uid`` (a negative signal number when a signal ended it): its
    node's agent writes it, then bumps ``NODE_EXITS``; the coordinator reads it."""
    return f"node_exit/{uid}"


def node_pid_key(uid: int) -> str:
    """The pid of worker ``uid`` on its node (for stack dumps and XID lines): the agent
    writes it when it started the worker."""
    return f"node_pid/{uid}"
