"""The guard on the coordinator: detectors in, ladder decisions journaled (log-only by default).

Why log-only by default: anything that can kill or evict part of a job must first prove itself
on real runs (the nvidia-resiliency-ext rule). So the guard runs every detector the coordinator
can feed and asks the one policy core (:func:`unbroken.core.ladder.decide`) what it would do;
it journals the detection (``alert``: a detection nobody acted on, unlike the runtime's
``detected``) and the decision (``ladder``, ``"mode": "log-only"``) but executes nothing.
Process deaths and hangs are masked by the train runtime in-band; the supervisor asks this same
ladder what to do about them (see below).

Detectors wired here, one module each (what each watches and why is in its docstring):

* **fail-slow** (:mod:`unbroken.guard.failslow`) — each group's own compute time per step, in
  rounds of 1 s: a group slower than 1.5x its peers' median in 5 consecutive rounds;
* **numeric** (:mod:`unbroken.guard.numeric`) — a NaN/Inf or a more than 5x jump of the
  committed loss or gradient norm: an implicit-failure fault;
* **health** (:mod:`unbroken.guard.health`) — every group's agent's CPU use and memory
  against the peers' (an ``alert``, never an action);
* **node health** (:mod:`unbroken.guard.nodes`) — each node agent's machine sample against
  fixed floors and against the other nodes (``node_health``, ``node_peers``; log-only);
* **XID** — new lines of a kernel-log file (``--xid-log``; dmesg saved to a file, so it can be
  tested here) mapped by the XID catalog to an action class
  (:class:`unbroken.detect.xid_source.XidSource`); a malformed line is journaled as a
  ``detector_warning`` and never stops anything. On many machines each node agent reads its
  own kernel log (``unbroken agent --xid-log``) and forwards the hits, pids already mapped to
  its workers (``on_node_xid``): the same answer.

A detector that fails is reported once and switched off; it never raises into the run.

``act=True`` (``--guard act``) carries the decisions out. The guard does not touch processes
or the store itself: it appends typed actions (:mod:`unbroken.core.actions`, one pure mapping
from a rung to what it means for the processes) to ``self.orders`` and the supervisor carries
them out in order — ``Evict`` (SIGKILL, death notice), ``Replace`` (a warm spare takes the
slot), ``Respawn`` (a fresh process in the same slot: retry in place), ``Quarantine``,
``RestartJob`` (from the checkpoint, after a requeue's backoff), ``StopJob`` (the ladder gave
up: exit 6), ``PostCode`` (code record ``code/<n>``: every member hot-swaps at one step
boundary) and ``PostVerdict`` (the answer to a runtime incident, ``StackedRunner._incident``:
``retry``, ``replay``, ``restore`` or ``stop``).

Deaths and hangs (``on_member_lost``) and wipe-outs (``on_wipeout``) ask the same ladder, and
their answers are carried out in log-only mode too: masking and replacing a dead group is the
runtime's baseline, not a guard action that could kill a healthy job.

Runtime incidents, read from the groups' journals, map onto ladder faults: a step error ->
``CODE``, a non-finite sum -> ``IMPLICIT``, a bitwise mismatch of redundant hosts -> ``SDC``;
the replay's majority names the corrupt machine -> ``CORRUPT`` (evicted at once, then every
member restores the last checkpoint whose SDC check passed). Each answer is journaled as
``ladder`` (the decision and its reason) and, once carried out, ``resolved`` (what the report's
ETTR accounting charges the fault's time to).

The package: :mod:`unbroken.guard.guard` (the class: ladder, incidents, orders) and one module
per detector it composes (``failslow``, ``numeric``, ``health``, ``nodes``).
"""

from unbroken.guard.guard import Guard

__all__ = ["Guard"]
