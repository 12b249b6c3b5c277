"""What a runner does about a bad step: the in-band check, the guard's verdicts and the
actions they order (part of :class:`~unbroken.runtime.stacked.StackedRunner`).

Every member reads the same reduced buffer, so every member finds the same incident at the
same step: a member's step error, a non-finite sum, or (on SDC check steps) hosts of one
shard type whose gradients differ bit for bit. Log-only (``verdicts=False``) journals it and
goes on as a run without a guard would. With verdicts, rank 0 posts the incident and every
member waits for the guard's ladder decision (``verdict/<step>/<n>``) and carries it out
identically: recompute (retry), restore a verified checkpoint in place, replay the suspect
types to localise silent corruption, swap to another code version, or stop. The decision is
the guard's (pure, in :mod:`unbroken.core.ladder`); this module only carries it out.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import numpy as np
import torch

from unbroken.core.replay import digest_mismatches
from unbroken.events import Event
from unbroken.protocol import code_key, incident_key, replay_key, verdict_key
from unbroken.runtime import stepbuf as sb
from unbroken.runtime.trainer import copy_state, make_trainer

__all__ = ["GuardStopError", "Incidents"]


class GuardStopError(RuntimeError):
    """The guard's ladder gave up on an incident (exit ``EXIT_NO_PROGRESS``)."""


class Incidents:
    """The incident half of the runner (mixed into ``StackedRunner``; uses its state)."""

    def _step_check(self, buf: torch.Tensor) -> tuple[str, dict] | None:
        """What every member reads from the same reduced buffer: a member's step error, a
        non-finite sum (NaN at the step it appears), or hosts of a type whose gradients differ
        bit for bit. None: commit."""
        tr, n = self.trainer, self.cfg.groups
        rest = self._check_region(buf)
        if rest[sb.ERR] > 0:
            return "code", {"errors": int(rest[sb.ERR]), "version": self.version}
        # the norm is NaN/inf iff an element is (or the squares overflow: then count exactly);
        # one reduction instead of an isfinite pass (a dot product: half a norm's time), and
        # _commit journals the same norm
        g = buf[:tr.numel]
        norm = float(torch.dot(g, g)) ** 0.5
        self._norm = (buf, norm)
        bad = 0 if np.isfinite(norm) else int((~torch.isfinite(buf[:tr.numel])).sum())
        if bad or not np.isfinite(rest[sb.LOSS]):
            return "implicit", {"nonfinite": bad}
        if self._check_step():
            d0 = tr.numel + n
            digests = sb.digests(buf[d0:d0 + n * n].view(n, n), range(n))
            bad = digest_mismatches(digests)
            if bad:
                return "sdc", {"mismatch": {str(t): {str(w): d for w, d in ds.items()}
                                            for t, ds in bad.items()}}
            self.journal({"event": Event.SDC_CHECK, "step": self.step, "ok": True,
                          "types": sum(1 for ds in digests.values() if len(ds) > 1),
                          "t": time.time()})
        return None

    def _posts(self) -> bool:
        """Whether this member posts the job's incident and replay records: rank 0 of the
        first plane (every member reads the same values; one writes them)."""
        return self.comm.rank == 0 and getattr(self.comm, "plane", 0) == 0

    def _incident(self, kind: str, detail: dict) -> bool:
        """Journal the incident; with verdicts, carry out the guard's decisions until one lets
        the step go on. True: commit this buffer (log-only); False: recompute the step."""
        n = self.incidents
        self.incidents += 1
        self.journal({"event": Event.INCIDENT, "kind": kind, "step": self.step, "n": n,
                      "gen": self.comm.generation, "members": self.comm.members,
                      "slot": self.my_slot, **detail, "t": time.time()})
        if self.verdicts and self._posts():  # one key to wait on (the journal says more)
            self.comm.store.set(incident_key(self.step, n), json.dumps({"kind": kind, **detail}))
        if not self.verdicts:
            if kind == "code":
                raise RuntimeError(f"step {self.step}: the training code failed on a member "
                                   f"({self.step_error or 'see its journal'})")
            return True  # log-only: the step goes on as it would without a guard
        while True:
            v = self._await_verdict(n)
            if int(v.get("code", 0)) > self.code_applied:
                self._apply_code(int(v["code"]))
            action = v.get("action")
            self.journal({"event": Event.VERDICT, "step": self.step, "n": n, **v,
                          "t": time.time()})
            if action == "retry":
                self.grads_step = -1
                return False
            if action == "restore":
                self._restore_to(int(v["step"]))
                return False
            if action == "commit":
                return True
            if action == "replay":
                # no types named (a NaN with no culprit): every shard type
                self._replay([int(t) for t in v["types"]] or list(range(self.cfg.groups)), n)
                n = self.incidents
                self.incidents += 1
                continue
            raise GuardStopError(f"step {self.step}: the guard stopped the job: "
                                 f"{v.get('reason', action)}")

    def _await_verdict(self, n: int) -> dict:
        key = verdict_key(self.step, n)
        try:
            self.comm.store.wait([key], timedelta(seconds=self.verdict_wait))
        except Exception as exc:
            raise GuardStopError(f"step {self.step}: no verdict for incident {n} within "
                                 f"{self.verdict_wait:.0f}s ({exc})") from None
        return json.loads(self.comm.store.get(key))

    def _replay(self, types: list[int], n: int) -> None:
        """Dual-phase replay reduced to what SPARe's redundancy allows: every member computes
        the suspect types on the same parameters and data; the digests go through one
        all-reduce, so the guard sees each machine's answer and takes the majority."""
        g = self.cfg.groups
        buf = torch.zeros(len(types) * g, dtype=torch.float64, device=self.dev)
        for i, t in enumerate(types):
            buf[i * g + self.my_slot] = float(sb.digest52(self.trainer.grad(self.step, t)))
        ok = self.comm.allreduce(buf)
        found = {str(t): {str(w): d for w, d in ds.items()}
                 for t, ds in sb.digests(buf.view(len(types), g), types).items()}
        rec = {"ok": bool(ok), "digests": found,
               "uids": {str(self.slot_of[u]): u for u in self.comm.members}}
        if self._posts():
            self.comm.store.set(replay_key(self.step, n), json.dumps(rec))
        self.journal({"event": Event.REPLAY, "step": self.step, "n": n,
                      "members": self.comm.members, **rec, "t": time.time()})

    def _restore_to(self, step: int) -> None:
        """Roll back in place to the durable checkpoint of ``step`` (verified by the SDC check
        of the step before it); every member loads the same one."""
        if self.ckpt is None:
            raise GuardStopError(f"restore to step {step}: no checkpoint directory")
        if self.comm.rank == 0:
            self.ckpt.wait()
        path = self.ckpt.directory / f"step-{step:08d}"
        if step == 0:  # nothing verified yet: the seeded initial state is the clean one
            self._install(make_trainer(self.cfg).state_tensors(), {"step": 0}, path="initial",
                          reason="verdict")
            return
        deadline = time.monotonic() + self.verdict_wait
        while not path.is_dir():  # rank 0's background save may still be renaming it
            if time.monotonic() > deadline:
                raise GuardStopError(f"restore to step {step}: {path} never appeared")
            time.sleep(0.01)
        self._install(*self.ckpt.load(self._ckpt_state(), path,
                                      **({"group": self.group.ckpt_pg} if self.group else {})),
                      path=str(path),
                      reason="verdict")

    def _apply_code(self, upto: int) -> None:
        """Hot update (or rollback) to the newest code record ``code/<upto>``: build the
        trainer of that version and carry the training state over; no process restarts."""
        rec = json.loads(self.comm.store.get(code_key(upto)))
        self.code_applied = upto
        if rec["version"] == self.version:
            return
        from dataclasses import replace as _replace

        new = make_trainer(_replace(self.cfg, model=rec["model"]))
        copy_state(new.state_tensors(), self.trainer.state_tensors())
        old, self.trainer, self.version = (self.version, self.hooks.wrap_trainer(self, new),
                                           rec["version"])
        self.grads_step = -1
        self.journal({"event": Event.CODE, "step": self.step, "from": old, "to": self.version,
                      "model": rec["model"], "n": upto, "t": time.time()})
