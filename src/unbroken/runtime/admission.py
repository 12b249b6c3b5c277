"""Spares and wipe-outs: admitting joiners at a step boundary and copying the committed
state to them (part of :class:`~unbroken.runtime.stacked.StackedRunner`).

A warm spare posts a join record; rank 0 reports the join count in the step buffer, so every
member admits it at the same boundary: a planned re-form with the joiner (the old generation
is not aborted, so a peer still receiving the last op's chunks finishes it), then the settle
names the joiners and the state goes to them. The state copy is a snapshot of the committed
state taken when sent, sha256-checked by the joiner; a bad copy is refused and the next old
member's is used. A wipe-out (a shard type lost every host) waits for replacements of the
dead slots and admits them the same way: the committed state every survivor holds is the
restart point (see the runner's docstring), so no step but the one in flight is lost.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import torch

from unbroken.core.rectlr import WipeOut
from unbroken.events import Event
from unbroken.protocol import JOIN_COUNT, admit_key, dead_key, join_key, state_key, wipeout_key
from unbroken.core.ledger import DivergenceError

__all__ = ["WipeOutError", "Admission"]


class WipeOutError(RuntimeError):
    """A shard type lost all of its hosts and no replacement came: the step cannot be resumed
    in memory (the supervisor restarts from the durable checkpoint)."""


class Admission:
    """The admission half of the runner (mixed into ``StackedRunner``; uses its state)."""

    @property
    def _ns(self) -> str:
        """The plane's key namespace (``protocol.plane_ns``): a group of several ranks admits
        a joining group plane by plane, each rank copying its own shard of the state."""
        return getattr(self.comm, "ns", "")

    @property
    def snap(self):
        """The buffer a state copy goes through (sender: captured when sent; joiner: received,
        verified, installed), allocated once at the first copy."""
        if self._snap is None:
            from unbroken.runtime.snapshot import Snapshot

            self._snap = Snapshot(self.trainer.state_tensors())
        return self._snap

    def _wipeout(self, d: WipeOut, members: list[int]) -> None:
        """No plan can cover every type: wait for replacements of the dead slots, admit them
        (a copy of the committed state every survivor holds) and resume this step."""
        k, st = self.step, self.comm.store
        live = set(self.live_slots(members))
        dead = set(range(self.cfg.groups)) - live
        self.journal({"event": Event.WIPEOUT, "step": k, "gen": self.comm.generation,
                      "members": members,
                      "lost_types": list(d.lost_types), "dead_slots": sorted(dead),
                      "reason": d.reason, "t": time.time()})
        st.set(wipeout_key(self.uid), json.dumps({"step": k, "dead_slots": sorted(dead)}))
        # the first join records (in order) that cover every dead slot: the same for everyone
        from unbroken.core.membership import wipeout_cover

        deadline = time.monotonic() + self.wipeout_wait
        records: list[tuple[int, bool]] = []
        while (took := wipeout_cover(records, dead)) is None:
            j = self.admitted + len(records)
            if st.add(JOIN_COUNT, 0) > j:
                rec = json.loads(st.get(join_key(j + 1)))
                records.append((int(rec["slot"]), st.check([dead_key(rec["uid"])])))
                continue
            if time.monotonic() > deadline:
                covered = {slot for slot, gone in records if not gone}
                raise WipeOutError(f"step {k}: {d.reason}; no replacement for slots "
                                   f"{sorted(dead - covered)} within {self.wipeout_wait:.0f}s")
            try:
                st.wait([join_key(j + 1)], timedelta(seconds=0.5))
            except Exception:
                pass
        self._admit(self.admitted + took, restart=True)

    def _admit(self, upto: int, restart: bool = False) -> None:
        """Admit join records ``admitted+1..upto`` at a step boundary: a planned re-form with
        the joiners (the old generation is not aborted), then the settle copies the committed
        state to them from a member's snapshot (checksummed; a bad copy is refused and the
        next member's used) and gives everyone a fresh plan."""
        st = self.comm.store
        live = set(self.live_slots())
        new: list[dict] = []
        for i in range(self.admitted + 1, upto + 1):
            rec = json.loads(st.get(join_key(i)))
            if st.check([dead_key(rec["uid"])]):
                continue  # a spare that died before it was admitted
            if rec["slot"] not in live and rec["slot"] not in {r["slot"] for r in new}:
                new.append(rec)
        self.admitted = upto
        if not new:
            return
        gen = self.comm.generation + 1
        joiners = [r["uid"] for r in new]
        for r in new:
            st.set(admit_key(r["uid"], self._ns), json.dumps({"gen": gen, "joiners": joiners}))
        self._offer(planned=True)
        members = self.comm.reform(expect=joiners, planned=True)
        self._recover(members, planned=True, restart=restart)

    def _send_state(self, members: list[int], joiners: list[int]) -> bool:
        """Copy the committed state from one old member to the joiners, each old member in turn
        until every joiner verified a copy. False: the generation broke.

        Point to point (``comm.send``): only the source and the joiners move the state, so an
        admission costs the same at 4 groups as at 32; the other members only take part in
        the one-float-per-member acknowledgement. A communicator without ``send`` gets an
        all-reduce to which only the source contributes."""
        from unbroken.runtime.snapshot import SnapshotError

        gen = self.comm.generation
        olds = [u for u in members if u not in joiners]
        send = getattr(self.comm, "send", None)
        rank = {u: i for i, u in enumerate(members)}
        for src in olds:
            if self.uid == src:
                self.snap.capture(self.trainer.state_tensors(), self._meta())
                info = {"meta": self.snap.meta, "digest": self.snap.digest()}
                self.comm.store.set(state_key(gen, src, self._ns), json.dumps(info))
                payload = self.hooks.state_payload(
                    self, self.snap.payload().to(self.dev, copy=True))
            elif self.uid in joiners or send is None:
                payload = torch.zeros_like(self.snap.payload(), device=self.dev)
            else:
                payload = None  # a bystander: no copy of the state passes through it
            if send is None:
                ok = self.comm.allreduce(payload)
            else:
                ok = payload is None or send(payload, rank[src], [rank[j] for j in joiners])
            if not ok:
                return False
            good = 1.0
            if self.uid in joiners:
                info = json.loads(self.comm.store.get(state_key(gen, src, self._ns)))
                try:
                    self.snap.receive(payload.cpu(), info["meta"], info["digest"])
                except SnapshotError as exc:
                    good = 0.0
                    self.journal({"event": Event.BAD_SNAPSHOT, "from": src, "error": str(exc),
                                  "t": time.time()})
            ack = torch.zeros(len(members), dtype=torch.float64, device=self.dev)
            ack[self.comm.rank] = good
            if not self.comm.allreduce(ack):
                return False
            if bool((ack == 1.0).all()):
                if self.uid in joiners:
                    meta = self.snap.restore_into(self.trainer.state_tensors())
                    self.needs_state = False
                    self.step = int(meta["step"])
                    self.admitted = int(meta["admitted"])
                    self.incidents = int(meta.get("incidents", 0))
                    if int(meta.get("code", 0)) > self.code_applied:  # the running version
                        self._apply_code(int(meta["code"]))
                    self.slot_of = {int(u): int(s) for u, s in meta["slot_of"].items()}
                return True
        raise DivergenceError("every member's snapshot failed its checksum at the joiner")

    def join(self, slot: int, timeout: float = 120.0) -> None:
        """Spare: ask to take over ``slot``, wait to be admitted, receive the state; ``run``
        trains from there (called by the worker as for an original member, so a joiner's
        stacks show the same frames as its peers' and stack aggregation compares like with
        like)."""
        st = self.comm.store
        if getattr(self.comm, "plane", 0) == 0:  # one join record for a group of ranks
            n = st.add(JOIN_COUNT, 1)
            st.set(join_key(n), json.dumps({"uid": self.uid, "slot": slot}))
        st.wait([admit_key(self.uid, self._ns)], timedelta(seconds=timeout))
        admit = json.loads(st.get(admit_key(self.uid, self._ns)))
        self.slot_of[self.uid] = slot
        self.needs_state = True
        self._offer(planned=False)
        members = self.comm.join(int(admit["gen"]))
        self._recover(members)  # the settle names this joiner and copies the state to it
        self.journal({"event": Event.JOINED, "step": self.step, "gen": self.comm.generation,
                      "slot": slot, "t": time.time()})
