"""The journal's events, defined once: each line of a journal is one JSON object whose
``"event"`` field is one of :class:`Event`'s values.

A journal is written by one process and read by others (the supervisor tails the workers'
``group-<uid>.jsonl``; the guard, ``core.ettr``, the live view, the report and ``bench/chaos.py``
read the merged ``journal.jsonl``), so the names are the wire format: :class:`Event` is a
``StrEnum`` whose values are the exact strings on disk, and a member compares and serialises as
its string (``json.dumps({"event": Event.COMMIT})`` writes ``{"event": "commit"}``).

Each member's docstring names its fields (beyond ``event``; ``t`` is wall time where present),
who emits it and who reads it by name. Readers look fields up with ``.get``: older journals
without a field added later still parse.

Imports nothing but ``enum``: the pure core and the journal tools use it without torch.
"""

from __future__ import annotations

import enum

__all__ = ["Event"]


class Event(enum.StrEnum):
    # -- the training runtime (runtime/stacked.py), one line per member -----------------------
    COMMIT = "commit"
    """step, gen, members, mine, contributors, loss, ...: a step's update applied. Emitted by
    the runner; read by the supervisor (progress, guard), ettr, view, ledger, benches."""
    MODE_SWITCH = "mode_switch"
    """step, from, to, reason, predicted {mode: s per sync-equivalent step}, times, bench:
    ``--sync auto`` changed the sync mode at a step boundary (runtime/syncmodes.py, every
    member). Read by the report (``mode_switches``)."""
    BENCH = "bench"
    """step, bench [groups], reason: ``mask`` (or ``auto`` in mask) changed the groups left
    out of the next step (runtime/syncmodes.py, every member)."""
    FAULT = "fault"
    """kind, group, uid, step [, external, code, version, model]: a fault injected (the runner,
    the drill) or observed from outside (the supervisor: death / hang). Read by ettr, view,
    report, bench/chaos."""
    FAULT_SKIPPED = "fault_skipped"
    """kind, group, step, reason: a drill fault with no live holder of its slot (the drill)."""
    STEP_ERROR = "step_error"
    """step, version, error, where: the user's step raised (the runner); read by the guard via
    the incident that follows."""
    SDC_CHECK = "sdc_check"
    """step, ok, types: a clean bitwise cross-check (the runner); read by the supervisor."""
    INCIDENT = "incident"
    """kind, step, n, gen, members, slot, ...detail: a runtime incident waiting for a verdict
    (the runner); the supervisor hands it to the guard."""
    VERDICT = "verdict"
    """step, n, action, ...: the verdict a member acted on (the runner)."""
    REPLAY = "replay"
    """step, n, members, ok, digests, uids: a replay's digests (the runner); read by the guard."""
    CODE = "code"
    """step, from, to, model, n: a hot code swap applied (the runner)."""
    CHECKPOINT = "checkpoint"
    """step, path: a durable checkpoint renamed into place (its writer, rank 0 of the
    generation, from the save's thread); read by the supervisor's guard (a roll-back goes
    only to a checkpoint written or loaded)."""
    RESTORE = "restore"
    """step, source ("none" | "checkpoint"), path, reason: state loaded (the runner); read by the
    supervisor (its guard: a checkpoint on disk) and the ledger."""
    ROLL_FORWARD = "roll_forward"
    """step, from: a step replayed from a peer's buffer during recovery (the runner; view)."""
    RESTART = "restart"
    """step, source, reason, t_ready [, incident, members, gen, joined, reform_at]: training
    resumed from a snapshot / checkpoint. Emitted by the runner (after a wipe-out), the guard
    (a rollback) and the supervisor (its own count); read by ettr, view, report, bench/chaos."""
    RESTARTED = "restarted"
    """a worker's ``restart`` line as the supervisor re-journals it (counted once as RESTART)."""
    ADMIT = "admit"
    """step, gen, members, joined, source, reform_at: joiners admitted (the runner)."""
    REPLAN = "replan"
    """step, gen, members, phase, depth, patch, reason, fresh, reform_at, cause: survivors
    re-planned around a loss (the runner); cause: why the old generation broke as this member
    saw it (a stale heartbeat and whose, a gloo error, a peer's flag); read by the supervisor,
    ettr, view, bench/chaos."""
    WIPEOUT = "wipeout"
    """step, gen, members, lost_types, dead_slots, reason: a loss no survivor can cover (the
    runner; ``gen``: the generation the survivors re-formed, absent in older journals);
    read by the supervisor, ettr, view, bench/chaos."""
    BAD_SNAPSHOT = "bad_snapshot"
    """from, error: a donor's state failed verification during a join (the runner)."""
    JOINED = "joined"
    """step, gen, slot: a spare joined the job (the runner); read by the supervisor."""
    CHECKPOINT_WARNING = "checkpoint_warning"
    """message: a checkpoint save / load problem (the runner's checkpoint store)."""
    # -- the communicator (runtime/ftcomm.py, in the ``done`` journal of its probe worker) -----
    INIT = "init"
    """gen, members, pg_init_s: the first process group (ftcomm)."""
    REFORM = "reform"
    """gen, members, leader, planned, dropped, cause, detected_at, rendezvous_s, ...: a new
    process group after a loss (ftcomm); read by benches."""
    JOIN = "join"
    """ftcomm: gen, members, pg_init_s (a joiner's first group); the supervisor: uid, slot, step
    (a spare joined, from its ``joined``). Read by ettr, view, report."""
    ABORT = "abort"
    """gen, reason: a collective aborted (ftcomm); read by benches."""
    GROUP_FENCED = "group_fenced"
    """gen, rank, reason, sibling (a silent sibling's rank), its own beats (as ``left_out``):
    a rank fenced its own group and exits 11 (ftcomm's ``fence_group``); the launcher
    replaces the group."""
    SUPERVISOR_SILENT = "supervisor_silent"
    """silent_s: the supervisor's heartbeat went stale (ftcomm)."""
    REATTACHED = "reattached"
    """gen, members: the communicator moved onto a standby supervisor's store, same generation
    and process group (ftcomm, ``runtime.reattach``)."""
    # -- the worker entry point (runtime/stacked_worker.py) ------------------------------------
    GUARD_STOP = "guard_stop"
    """error: the guard stopped the job (exit 6)."""
    LEFT_OUT = "left_out"
    """step, error, beat_gap_max_s, beat_gaps_s, beat_parts_max (the longest wake-up wait and
    store round trip of its beats), late_beats (where its main thread was when a late beat
    finally ran): a member the others re-formed without, as it
    found out before leaving (exit 9; the worker); its own heartbeat's gaps over the last 5 s
    say whether its beat thread starved (a gap over the staleness) or the peers misjudged it."""
    STOPPED = "stopped"
    """step, checkpoint, error: stopped on request (exit 8); read by the supervisor."""
    COORDINATOR_LOST = "coordinator_lost"
    """step, checkpoint, error: the store / supervisor went away (exit 5); read by the
    supervisor."""
    ADOPTED = "adopted"
    """step, waited_s, checkpoint: the store went away, and instead of exiting this member
    re-attached to the store of the supervisor that took the lease over, and trains on from
    the same step (``--etcd``, ``runtime.reattach``); waited_s: from its stop to the go;
    checkpoint_s: of that, writing the durable checkpoint of the paused state (rank 0);
    ahead: it had connected to that store before the takeover (the standby announced it)."""
    HEALTH = "health"
    """uid, step, compute_s, rate, cpu, ... [, error]: a health sample (detect/health.py's
    agent); read by the supervisor's guard."""
    # -- the supervisor (supervise/supervisor.py, attempt.py, drill.py) ------------------------
    START = "start"
    """config, faults, ...: the run's configuration (the supervisor); read by view, report,
    bench/chaos."""
    END = "end"
    """wall_s [, code, reason]: the run ended (the supervisor); read by the report."""
    JOURNAL_DAMAGED = "journal_damaged"
    """file: a worker journal line could not be parsed (the supervisor)."""
    JOURNAL_REPAIRED = "journal_repaired"
    """file, reason: a cut-off last line removed on ``--resume`` (the supervisor)."""
    TAKEOVER = "takeover"
    """leader, step, members, waited_s, adopted_s: a standby took the lease of a running job
    and adopted its members where they stopped, with no restart (``supervise.adopt``)."""
    RESTART_REQUESTED = "restart_requested"
    """reason, attempt, backoff_s: the job restarts from a checkpoint (the supervisor; view)."""
    STOP_REQUESTED = "stop_requested"
    """signal: SIGINT / SIGTERM received (the supervisor; view)."""
    DETECTED = "detected"
    """group, slot, how [, stacks]: a member removed (exit, heartbeat, xid, replay, fail-slow,
    ...) (the supervisor); stacks: where a member left behind alive has its py-spy dump, taken
    before the kill; read by ettr, view, bench/chaos."""
    NODE_LOST = "node_lost"
    """node, reason, uids, t: a node agent gone (its process ended) or cut off (its heartbeat
    silent); its processes are declared dead at once (``nodes.cluster``, via the supervisor)."""
    NODE_HEALTH = "node_health"
    """node, mem_avail_mb, mem_total_mb, disk_free_mb, load1, cpus, workers, t: a node's
    machine sample, posted by its agent each second (``nodes.health``); problems become the
    guard's ``alert`` (``core.nodes.health_problems``; ``core.nodes.peer_health`` against the
    other nodes: ``how`` = ``node_peers``; log-only)."""
    NODE_XID = "node_xid"
    """node, uid, code, action, reason, pci, t: an XID line of a node's own kernel log (the
    agent's ``--xid-log``), read by the guard like the coordinator's ``--xid-log``."""
    NODE_REJOINED = "node_rejoined"
    """node, reason, t: a fenced node's agent (``unbroken agent --rejoin``) woke up, killed
    what it ran and beats again: its node takes spares again (``nodes.cluster``)."""
    NO_SPARE = "no_spare"
    """slot: no warm spare for a lost slot (the supervisor)."""
    SPARES = "spares"
    """pool, pids: the warm spares not yet assigned, at each change (the supervisor).
    Recorded in etcd (``spares``)."""
    ASSIGN = "assign"
    """uid, slot [, fresh]: a spare sent to a slot (the supervisor)."""
    QUARANTINE = "quarantine"
    """group, slot: a member quarantined (the supervisor; view)."""
    CODE_POSTED = "code_posted"
    """n, version, model: a code record posted (the supervisor)."""
    VERDICT_POSTED = "verdict_posted"
    """key, action, ...: a verdict posted (the supervisor)."""
    # -- the guard (unbroken.guard) -------------------------------------------------------------
    EXCLUSIONS = "exclusions"
    """exclusions [, restored]: the eviction history after it changed (``core.exclusion.
    records_json``; ``restored``: taken over from etcd by a standby). Recorded in etcd."""
    LADDER = "ladder"
    """for, fault, mode, rung, groups, exit_code, reason: a ladder decision; ``fault`` is the
    ladder input's ``core.ladder.FaultKind`` value ("update" for a queued or forced update).
    Read by view, bench/chaos."""
    ALERT = "alert"
    """how, group, reason [, step, kind, signal, value, signals, code, action, pci]: a detection
    (acted on or log-only); read by view."""
    RESOLVED = "resolved"
    """incident, detected_t, how [, restart]: the guard answered an incident; read by ettr,
    view, bench/chaos."""
    DETECTOR_WARNING = "detector_warning"
    """detector, message: a detector switched off, a verdict it holds back (fail-slow while a
    replay's vote is open), or a malformed input line."""
