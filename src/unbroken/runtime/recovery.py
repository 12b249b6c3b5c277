"""A new generation, whatever brought each member into it: the settle (part of
:class:`~unbroken.runtime.stacked.StackedRunner`).

After a failed op a member re-forms (``FTComm.reform``); at an admission the members re-form
on purpose; a joiner enters its first generation. In every case the first thing the members
do in it is the same: agree on where each stands (step, old member or joiner, admitted
records, plan generation), roll forward a member one commit behind, send the joiners the
state, and take one plan -- a fresh one at a step boundary, or ``rectlr.decide``'s failure
re-plan with what each group has computed, whose patch types this member then computes. The
agreement rides on the rendezvous (``FTComm.offer``/``reports``) where the communicator
carries it, so it costs no collective; otherwise one all-reduce of the reports.
"""

from __future__ import annotations

import time

import torch

from unbroken.core.ledger import DivergenceError
from unbroken.core.membership import Report, settle
from unbroken.core.rectlr import WipeOut, decide
from unbroken.events import Event
from unbroken.runtime.admission import WipeOutError

__all__ = ["Recovery"]


class Recovery:
    """The recovery half of the runner (mixed into ``StackedRunner``; uses its state)."""

    def _recover(self, members: list[int] | None = None, *, planned: bool = False,
                 restart: bool = False) -> None:
        """Enter a new generation and settle in it; loops on new failures.

        ``members``: a generation this member already entered (an admission's planned
        re-form, a joiner's ``join``); None: re-form after a failed op."""
        while True:
            if members is None:
                self._offer(planned=False)
                members = self.comm.reform()
            if self.group is not None and not self.group.same_members(self.comm, members):
                # the group's planes formed different generations: break this one too
                self.comm.fail("the group's ranks formed different generations")
            elif self._settle(members, planned=planned, restart=restart):
                return
            members, planned = None, False

    def _report(self, planned: bool) -> list[float]:
        """What this member tells the others when it settles into a new generation: (step,
        old member, admitted records, joiner slot, planned, plan generation)."""
        old = not self.needs_state
        return [float(self.step) if old else -1.0, 1.0 if old else 0.0, float(self.admitted),
                -1.0 if old else float(self.my_slot), 1.0 if planned else 0.0,
                float(self.plan_gen) if old else -1.0]

    def _offer(self, planned: bool) -> None:
        """Publish the settle report with the coming rendezvous, where the communicator
        can (``FTComm.offer``): the settle then needs no all-reduce of its own."""
        offer = getattr(self.comm, "offer", None)
        if offer is not None:
            offer(self._report(planned))

    def _settle(self, members: list[int], *, planned: bool, restart: bool = False) -> bool:
        """The first collective of every generation, whatever brought each member into it (a
        failed op, an admission at a step boundary, a joiner's first generation).

        Every member's (step, old member, admitted records, joiner slot, planned, plan
        generation) -- published with the member list (``FTComm.offer``), or else one
        all-reduce of them -- gives everyone the same picture, so all take the same path:
        a member one commit behind is rolled forward with a peer's reduced buffer; joiners
        named in the buffer get the state; then either a fresh plan for the live slots (an
        admission, or members whose plans disagree because a settle broke half-way) or the
        failure re-plan ``rectlr.decide`` with what each group computed. Without this, a
        member recovering from a failed op and its peers admitting a spare at the same
        boundary entered different first collectives on the same group (a gloo mismatch).

        False: the generation broke during the settle (re-form and settle again)."""
        t0 = time.time()
        m, r = len(members), self.comm.rank
        old = not self.needs_state
        mine = self._report(planned)
        got = getattr(self.comm, "reports", None)
        if got is not None and got[0] == self.comm.generation and \
                list(got[1]) == list(members):
            # every member's report came with the member list (one record, so every member
            # takes this path or none does)
            if got[1][self.uid] != mine:  # offered before the re-form: nothing may change it
                raise DivergenceError(f"gen {self.comm.generation}: settle report {mine} "
                                      f"differs from the one offered, {got[1][self.uid]}")
            cols = [[float(got[1][u][j]) for u in members] for j in range(6)]
        else:  # a communicator without reports: one all-reduce of them
            v = torch.zeros(6 * m, dtype=torch.float64, device=self.dev)
            v[r::m] = torch.tensor(mine, dtype=torch.float64)
            if not self.comm.allreduce(v):
                return False
            cols = v.view(6, m).tolist()
        t_settled = time.time()
        s = settle([Report(step=int(cols[0][i]), old=cols[1][i] == 1.0,
                           admitted=int(cols[2][i]), joiner_slot=int(cols[3][i]),
                           planned=cols[4][i] > 0, plan_gen=int(cols[5][i]))
                    for i in range(m)])
        if s.problem == "no state":
            raise WipeOutError(f"gen {self.comm.generation}: {s.reason} (members {members})")
        if s.problem is not None:
            raise DivergenceError(s.reason)
        if s.source is not None:
            b = (self.last_buf.clone() if r == s.source
                 else torch.zeros(self._buflen(), dtype=torch.float64, device=self.dev))
            if not self.comm.allreduce(b):
                return False
            if old and self.step == s.lo:
                self.journal({"event": Event.ROLL_FORWARD, "step": s.lo,
                              "from": members[s.source], "t": time.time()})
                self._commit(b, rolled=True)
        joiners = {members[i]: slot for i, slot in s.joiners.items()}
        for u, slot in joiners.items():
            self.slot_of[u] = slot
        if old:
            self.admitted = s.admitted
        fresh = s.fresh
        if joiners and not self._send_state(members, list(joiners)):
            return False
        live = self.live_slots(members)  # a joiner knows the old members' slots from here
        if fresh:
            d = self._fresh_plan(live)
        else:
            self._ensure_grads()
            d = decide(self.layout, live, self.stacks, self.depth,
                       computed={w: sorted(self.computed.get(w, ())) for w in live})
        if isinstance(d, WipeOut):
            self._wipeout(d, members)
            return True
        self.stacks, self.depth, self.contrib = d.stacks, d.depth, d.contributions()
        self.plan_gen = self.comm.generation
        if fresh:  # a step boundary for the plan: every group computes what it contributes
            self.computed = {w: set(ts) for w, ts in self.contrib.items()}
            if joiners:
                self.journal({"event": Event.RESTART if restart else Event.ADMIT, "step": self.step,
                              "gen": self.comm.generation, "members": members,
                              "joined": {str(u): s for u, s in joiners.items()},
                              "source": "memory" if restart else "snapshot", "reform_at": t0,
                              "t": time.time()})
                return True
        for w, ts in d.patch.items():
            self.computed.setdefault(w, set()).update(ts)
        # a member whose training code failed this step computes nothing more: its next op
        # carries the error in-band (``_pack``), every member meets it as one incident, and
        # the guard's verdict recomputes the step under this plan (a retry) or leaves it
        mine = [] if fresh or self.step_error is not None else d.patch.get(self.my_slot, ())
        if mine:
            self.hooks.before_patch(self)
        t_patch = time.time()
        for t in mine:
            try:
                self.grads[t] = self.trainer.grad(self.step, t)
            except Exception as exc:  # as in the step's own compute: in-band, not a crash
                self._step_failed(exc)
                break
        if not fresh and self.step_error is None:
            missing = set(self.contrib.get(self.my_slot, ())) - set(self.grads)
            assert not missing, f"plan assigns types {missing} that were never computed"
        # the recovery's phases as this member saw them: noticed (detected_at), the new
        # generation formed (reform_at: the settle starts), agreed (settle_s: its first
        # all-reduce), its own patch computed (patch_s); the commit follows
        self.journal({"event": Event.REPLAN, "step": self.step, "gen": self.comm.generation,
                      "members": members, "phase": d.phase, "depth": d.depth,
                      "patch": {str(self._uid_of(w)): list(ts) for w, ts in d.patch.items()},
                      "reason": d.reason, "fresh": fresh, "reform_at": t0,
                      **self._reform_phases(), "settle_s": round(t_settled - t0, 4),
                      "patch_s": round(time.time() - t_patch, 4),
                      "cause": getattr(self.comm, "last_cause", None), "t": time.time()})
        if not fresh:
            self.hooks.after_replan(self, d)
        return True
