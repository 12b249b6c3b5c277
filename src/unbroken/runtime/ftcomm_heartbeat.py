"""The heartbeat of :class:`~unbroken.runtime.ftcomm.FTComm`: one thread that beats, judges the
peers, raises and relays the abort flag, and watches the supervisor; and the doorbell that wakes
a member blocked in an op.

* The heartbeat thread (own store client) bumps ``hb/<uid>`` every ``heartbeat_period``
  seconds and watches the other members. A member whose counter has not moved for
  ``staleness`` seconds (5 s until the first collective has completed: start-up is slow, not
  hung), or that a coordinator declared dead (``declare_dead``), makes it set ``abort/<gen>``.
  A gloo error does the same, so all survivors stop within milliseconds. Who is stale or live
  is decided by the pure rules of :mod:`unbroken.core.membership`.
* The abort flag is a store counter (``abort/<gen>``) that the heartbeat thread reads once a
  period in the same round trip as the peers' heartbeats, and wakes the op: the step's
  critical path makes no store round trip. The local flag it sets is the communicator's
  (``FTComm._set_abort``).
* The member that aborts a generation first also rings every member's *doorbell*, a UDP
  socket each member's thread waits on (its address in ``bell/<uid>``), so members blocked in
  the op wake at once rather than at their next read (a re-form waits for the last of them).
  Not a thread waiting in the store: that needs a connection of its own, and connections
  opened per re-form, while training, or a third one per member at start-up all stalled the
  TCPStore server for about 5 s here. So a member holds exactly two store connections: the
  caller's and this thread's.
* The same round trip reads the supervisor's heartbeat (``protocol.SUPERVISOR_HB``; a stopped
  or wedged supervisor can neither replace nor guard anyone, so the training loop stops as if
  it were gone) and the counters the training loop ``watch``es (control values it needs at
  step boundaries, off its critical path).

The thread talks to its communicator only through :class:`_Owner` (the generation it
watches, the abort flag, the two "lost" signals); its observations are its own, under its own
lock.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist

from unbroken.protocol import DEAD_EPOCH, SUPERVISOR_HB, dead_key, hb_key
from unbroken.core.membership import (
    Observation,
    beat_clock,
    live_members,
    observe,
    silence_rule,
    starved_observer,
)

__all__ = ["Heartbeat", "abort_key", "gloo_error_key", "bell_key"]


def abort_key(gen: int, ns: str = "") -> str:
    """Generation ``gen``'s abort counter: bumped by the member that aborts it first, read by
    every member's heartbeat with the peers' counters (``ns``: the plane,
    ``protocol.plane_ns``)."""
    return f"{ns}abort/{gen}"


def gloo_error_key(gen: int, ns: str = "") -> str:
    """Set (to the error) when an op of ``gen`` failed in gloo: evidence that a peer *process*
    is gone, which shortens the next rendezvous's wait (``rendezvous_staleness``)."""
    return f"{ns}abort/{gen}/gloo"


def bell_key(uid: int, ns: str = "") -> str:
    """The store key of member ``uid``'s doorbell address ("host:port", UDP)."""
    return f"{ns}bell/{uid}"


def _own_address(store: Any) -> str:
    """This host's address as the store's host reaches it (no packet is sent)."""
    host = getattr(store, "host", "127.0.0.1")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _clone(store: dist.TCPStore) -> dist.TCPStore:
    """A second client connection to the same TCPStore (a client is not shared across threads)."""
    try:
        return store.clone()
    except (AttributeError, RuntimeError):  # pragma: no cover - older torch
        return dist.TCPStore(store.host, store.port, is_master=False, wait_for_workers=False)


class _Owner(Protocol):
    """What the heartbeat asks of its communicator (``FTComm``)."""

    def _current(self) -> tuple[int, list[int]]:
        """The generation and its members, read together."""

    def _staleness(self) -> float:
        """The silence tolerated now (longer until the first collective completed)."""

    def _check_abort(self, gen: int) -> bool:
        """Whether ``gen`` is known to be aborted (the local flag)."""

    def _set_abort(self, gen: int, reason: str, store: Any = None) -> None:
        """Abort ``gen`` (a peer is lost): the local flag, the store's counter, the doorbells."""

    def _peer_aborted(self, gen: int, how: str = "") -> None:
        """A peer aborted ``gen``: set the local flag and wake the op, publish nothing."""

    def _store_gone(self) -> None:
        """Three periods without an answer from the store: the coordinator is gone."""

    def _supervisor_silent(self, silent: float) -> None:
        """The supervisor's heartbeat has not moved for ``silent`` s."""

    def _sibling_lost(self, rank: int, silent: float) -> None:
        """Rank ``rank`` of this member's own group has gone silent for ``silent`` s."""


class Heartbeat:
    """The heartbeat thread and the doorbell of member ``uid`` (both daemon threads, started
    here; ``close`` stops them once the owner set ``stop``).

    ``store`` is the caller's client: used here only from the caller's thread (the doorbell's
    address at start-up, ``watch``'s first read); the thread beats on a clone of its own.
    """

    def __init__(self, owner: _Owner, uid: int, store: dist.TCPStore, *, period: float,
                 staleness: float, supervisor_staleness: float,
                 stop: threading.Event, ns: str = "",
                 siblings: dict[int, str] | None = None,
                 client: dist.TCPStore | None = None) -> None:
        """``client``: the thread's own client of ``store``, connected ahead (a member that
        re-attaches to a standby's store connected to it while it stood by); default: a
        clone of ``store`` made here."""
        self._owner = owner
        self.uid = uid
        # the plane's key namespace (``protocol.plane_ns``) and the heartbeat keys of the
        # other ranks of this member's own group, rank -> key: a silent one is the group's
        # failure (``_Owner._sibling_lost``), judged like a peer
        self.ns = ns
        self.siblings = dict(siblings or {})
        self._sib_obs: dict[Any, Observation] = {}
        self.period = period
        self.staleness = staleness
        # 0: the supervisor is not watched
        self.supervisor_staleness = supervisor_staleness
        self._stop = stop
        self._lock = threading.Lock()
        self._obs: dict[Any, Observation] = {}
        self._beats = 0.0  # the beat clock (core.membership.beat_clock): peers' beats so far
        self._dead: set[int] = set()
        self._dead_epoch = 0
        self._sup_obs: dict[Any, Observation] = {}
        # store counters the caller wants read off its hot path (``watch``): the thread reads
        # them with the peers' counters, in the same round trip
        self.watched: dict[str, int] = {}
        self.errors = 0  # failed beats (store hiccups)

        # this member's own beats (``report``): (when it landed, monotonic; the wait from the
        # previous loop's read to this wake-up; the add's round trip). After being left out as
        # silent, a long wait is a thread that got no CPU or GIL, a long round trip a store
        # that answered late, and neither: peers that misjudged a live member
        self.beats: deque[tuple[float, float, float]] = deque(maxlen=100)
        self.late_beats: deque[dict] = deque(maxlen=5)  # _note_late_beat
        self._store = client if client is not None else _clone(store)
        self._store.add(hb_key(uid, ns), 1)  # first beat before anyone can judge us
        self.beats.append((time.monotonic(), 0.0, 0.0))
        self._known: set[str] = set()  # keys the thread has seen exist (multi_get blocks on a
        #                                missing one)
        self._thread = threading.Thread(target=self._monitor, name=f"ftcomm-hb-{uid}",
                                        daemon=True)
        self._thread.start()
        # the abort doorbell (``_doorbell``): a UDP socket, so ringing it involves neither the
        # store nor a connection
        self._bell_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._bell_sock.bind(("", 0))
        self._bells: dict[int, tuple[str, int]] = {}  # member -> its doorbell's address
        store.set(bell_key(uid, ns), f"{_own_address(store)}:{self._bell_sock.getsockname()[1]}")
        self._bell = threading.Thread(target=self._doorbell, name=f"ftcomm-bell-{uid}",
                                      daemon=True)
        self._bell.start()

    def close(self, wait: bool = True) -> None:
        """Wake the doorbell thread so that it sees the stop, and wait for the heartbeat's
        (not with ``wait=False``: a thread blocked on a dead store -- torch looks an address
        up in DNS on each error -- ends by itself, and judges nothing once stopped)."""
        try:
            self._bell_sock.sendto(b"stop", ("127.0.0.1", self._bell_sock.getsockname()[1]))
        except OSError:
            pass
        if wait:
            self._thread.join(timeout=2 * self.period + 1.0)

    # ------------------------------------------------------------------ liveness
    def live(self, members: list[int], staleness: float) -> list[int]:
        """``members`` judged live from this member's observations."""
        with self._lock:
            obs, dead, beats = dict(self._obs), set(self._dead), self._beats
        obs.pop(self.uid, None)
        return self._judge(members, obs, time.monotonic(), staleness, dead - {self.uid}, beats)

    def _judge(self, members, obs, now, staleness, dead, beats) -> list[int]:
        """Live members: silent for ``staleness`` s while the others beat that many periods,
        or silent three times as long whatever the others did (``core.membership``)."""
        min_beats, ceiling = silence_rule(staleness, self.period)
        return live_members(members, obs, now, staleness, dead, beats=beats,
                            min_beats=min_beats, ceiling=ceiling)

    # ------------------------------------------------------------------ own beats
    def report(self, window: float = 5.0) -> dict[str, Any]:
        """This member's own heartbeat over the last ``window`` s (``FTComm.beat_report``)."""
        now = time.monotonic()
        beats = list(self.beats)  # the first beat is there from the start
        bs = [b for b in beats if now - b[0] <= window] or beats[-1:]
        ts = [b[0] for b in bs] + [now]
        gaps = [round(b - a, 3) for a, b in zip(ts, ts[1:])]
        return {"beat_gap_max_s": max(gaps), "beat_gaps_s": gaps[-20:],
                "beat_parts_max": {"wake_s": round(max((b[1] for b in bs), default=0.0), 3),
                                   "add_s": round(max((b[2] for b in bs), default=0.0), 3)},
                "late_beats": list(self.late_beats)}

    def _note_late_beat(self, at: float, late: float) -> None:
        """Where the main thread is when this thread finally runs after a late wake-up: a
        thread that held the GIL (or the CPU) meanwhile shows in its frames."""
        frames = sys._current_frames()
        main = frames.get(threading.main_thread().ident)
        # no source lines: reading files here would delay the next beat further
        stack = traceback.StackSummary.extract(traceback.walk_stack(main), limit=6,
                                               lookup_lines=False) if main is not None else []
        where = [f"{Path(fs.filename).name}:{fs.lineno} {fs.name}" for fs in reversed(stack)]
        self.late_beats.append({"at": round(at, 3), "late_s": round(late, 3), "main": where,
                                "threads": len(frames)})

    # ------------------------------------------------------------------ doorbell
    def ring(self, gen: int, members: list[int]) -> None:
        """Ring ``members``' doorbells: ``gen`` is aborted (one datagram each)."""
        msg = f"abort {gen}".encode()
        for m in members:
            addr = self._bells.get(m)
            if addr is not None:
                try:
                    self._bell_sock.sendto(msg, addr)
                except OSError:
                    pass  # the heartbeat's read of the flag is still on its way

    def _doorbell(self) -> None:
        """Wait for this member's doorbell: a datagram "abort <gen>" from the member that
        aborted generation ``gen`` first.

        Members blocked in an op learned of a peer's abort at their next heartbeat read, up
        to a period later, and a re-form's rendezvous waits for the last of them: at 32 groups
        most of the 0.1 s between the first abort and the last member's. A datagram needs no
        store round trip and no connection; the store cannot serve as the bell: a thread
        waiting there needs a connection of its own, and a connection opened while the box
        trains (or a third one per member at start-up) stalled torch's TCPStore for 5 s; a
        wait with a timeout on the heartbeat's connection took 200 ms a call. A datagram
        lost costs what there was before: the next heartbeat read."""
        while not self._stop.is_set():
            try:
                data = self._bell_sock.recv(64)
            except OSError:
                return
            parts = data.split()
            if self._stop.is_set():
                return
            if len(parts) == 2 and parts[0] == b"abort" and parts[1].isdigit():
                self._owner._peer_aborted(int(parts[1]), " (doorbell)")

    def _learn_bells(self, st: Any, members: list[int]) -> None:
        """Read the doorbell addresses of members not known yet (heartbeat thread, off the
        critical path; a member's is posted before it can be a member)."""
        for m in members:
            if m == self.uid or m in self._bells:
                continue
            key = bell_key(m, self.ns)
            if st.check([key]):
                host, port = st.get(key).decode().rsplit(":", 1)
                self._bells[m] = (host, int(port))

    # ------------------------------------------------------------------ watched counters
    def watch(self, keys, store: Any) -> None:
        """Read these store counters every period from now on (``FTComm.watch``); ``store``:
        the caller's client, for one read now."""
        keys = [k for k in keys if k not in self.watched]
        if not keys:
            return
        # one read now: what was posted before the first step applies at the first boundary
        for k in keys:
            self._observe_watched(k, store.add(k, 0))

    def _observe_watched(self, key: str, value: int) -> None:
        # the counters only grow: a heartbeat read that began before a fresher one must not
        # take the value back
        self.watched[key] = max(self.watched.get(key, 0), int(value))

    def _watch_supervisor(self, counter: int, now: float, last: float) -> None:
        """The supervisor's heartbeat, judged like a peer's (a starved observer judges
        nobody: ``starved_observer``); silent for ``supervisor_staleness`` s: the owner's
        ``supervisor_lost``."""
        obs, _starved = starved_observer(self._sup_obs, last, now, self.staleness)
        self._sup_obs = observe(obs, {"supervisor": counter}, now)
        silent = now - self._sup_obs["supervisor"][1]
        if silent > self.supervisor_staleness:
            self._owner._supervisor_silent(silent)

    # ------------------------------------------------------------------ the thread
    def _monitor(self) -> None:
        """Heartbeat thread: beat, watch peers, raise and relay the abort flag.

        A closed heartbeat judges nothing: its owner may have moved onto another store
        (``FTComm.reattach``) while a call on the old one was still blocked -- torch's client
        formats its socket's address with a reverse DNS lookup on an error, which took 5 s
        here -- and the late failure must not tell the re-attached owner its store is gone."""
        st = self._store
        me = self.uid
        owner = self._owner
        last = time.monotonic()
        errors = 0
        while not self._stop.wait(self.period):
            try:
                woke = time.monotonic()
                st.add(hb_key(me, self.ns), 1)
                beat = time.monotonic()
                self.beats.append((beat, woke - last, beat - woke))
                if woke - last > 3 * self.period:
                    self._note_late_beat(beat, woke - last)
                gen, members = owner._current()
                others = [m for m in members if m != me]
                if any(m not in self._bells for m in others):
                    self._learn_bells(st, others)
                watch = list(self.watched)
                # the generation's abort counter rides in the same round trip
                sibs = list(self.siblings.values())
                keys = [hb_key(m, self.ns) for m in others] + sibs + \
                    [abort_key(gen, self.ns), DEAD_EPOCH]
                if self.supervisor_staleness > 0:
                    keys.append(SUPERVISOR_HB)
                keys += watch
                # one round trip for all counters; multi_get blocks on a missing key, so a
                # key is read that way once it is known to exist (created by add otherwise)
                if self._known.issuperset(keys) or st.check(keys):
                    vals = [int(v) for v in st.multi_get(keys)]
                    self._known.update(keys)
                else:
                    vals = [st.add(k, 0) for k in keys]
                if watch:
                    for k, v in zip(watch, vals[-len(watch):]):
                        self._observe_watched(k, v)
                    del vals[-len(watch):]
                if self.supervisor_staleness > 0:
                    sup = vals.pop()
                counters = dict(zip(others, vals[:len(others)]))
                sib_counters = dict(zip(self.siblings, vals[len(others):-2]))
                flagged, epoch = vals[-2], vals[-1]
                dead: set[int] = set()
                if epoch != self._dead_epoch:
                    dead = {m for m in members if st.add(dead_key(m), 0) > 0}
                if self._stop.is_set():  # closed while its store call blocked: see below
                    return
                now = time.monotonic()
                # the previous read, for the supervisor's starved-observer rule; peers need no
                # such rule: the beat clock only moves as far as they beat
                prev, last = last, now
                with self._lock:
                    self._beats += beat_clock(self._obs, counters)
                    self._obs = observe(self._obs, counters, now, self._beats)
                    self._dead |= dead
                    self._dead_epoch = epoch
                    obs, all_dead, beats = dict(self._obs), set(self._dead), self._beats
                if self.supervisor_staleness > 0:
                    self._watch_supervisor(sup, now, prev)
                live = self._judge(members, obs, now, owner._staleness(), all_dead - {me},
                                   beats)
                if sib_counters:
                    self._sib_obs = observe(self._sib_obs, sib_counters, now, beats)
                    quiet = set(self.siblings) - set(self._judge(
                        list(self.siblings), self._sib_obs, now, owner._staleness(), set(),
                        beats))
                    if quiet:
                        q = min(quiet)
                        owner._sibling_lost(q, now - self._sib_obs[q][1])
                lost = [m for m in members if m not in live and m != me]
                if lost and not owner._check_abort(gen):
                    why = "declared dead" if set(lost) & all_dead else "stale heartbeat"
                    owner._set_abort(gen, f"{why}: {lost}", st)
                elif not owner._check_abort(gen) and flagged > 0:
                    owner._peer_aborted(gen)  # a peer broke the generation: wake our op
                errors = 0
            except Exception:  # store hiccup: keep beating; repeated failures show in the count
                if self._stop.is_set():  # closed meanwhile: judges nothing (see below)
                    return
                self.errors += 1
                errors += 1
                if errors >= 3:  # three periods without the coordinator: it is gone
                    owner._store_gone()  # a waiting op judges what that means for it
                    # and no more calls on it: each failed one costs a reverse DNS query
                    # (torch formats the socket's address), ten a second per member while
                    # the job waits for a standby; enough of them crowd the resolver, whose
                    # dropped queries then stalled the takeover's own connects 1-5 s. The
                    # verdict is final (``store_lost`` holds until a re-attach, which brings
                    # a heartbeat of its own), so nothing is judged here any more.
                    self._stop.wait()
                    return
