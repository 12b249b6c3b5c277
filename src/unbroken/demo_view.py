"""The demo's live view (rich): progress, loss, the groups, and one line per notable event.

``LiveView.update(event)`` takes each journal event as it arrives and returns the story line it
added or amended (None for routine events such as commits), so a driver without a terminal can
print that line instead of redrawing the view. ``__rich__`` renders the whole view for
``rich.live.Live``. Presentation only: ETTR comes from :mod:`unbroken.core.ettr`.
"""

from __future__ import annotations

from collections import deque

from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from unbroken.core.ettr import RESOLVED_BY, ettr_report
from unbroken.events import Event

_STYLE = {"live": "bold white on green", "dead": "bold white on red",
          "hung": "bold black on yellow", "joined": "bold white on blue",
          "out": "bold white on grey37"}
MAX_LINES = 8


class LiveView:
    def __init__(self, config: dict, *, lines: int = MAX_LINES) -> None:
        self.config = dict(config or {})
        self.groups = int(self.config.get("groups", 0) or 0)
        self.total = int(self.config.get("steps", 0) or 0)
        self.step: int | None = None  # last committed step
        self.loss: float | None = None
        self.gen = 0
        self.depth = 1
        self.status: dict[int, str] = {u: "live" for u in range(self.groups)}
        self.slot: dict[int, int] = {u: u for u in range(self.groups)}
        self.events: list[dict] = []
        self.lines: deque[list] = deque(maxlen=lines)  # [text, style]; mutable to amend
        self._pending: dict[int, tuple[dict, list]] = {}  # group -> (fault, its line)
        self._answers: dict[str, list] = {}  # incident kind -> [(fault, its line)] waiting
        self._seen: set[tuple] = set()  # replans/wipe-outs journaled by several groups
        self._ettr: tuple[int, float | None] = (-1, None)

    # -- state -----------------------------------------------------------------------------
    def _add(self, text: str, style: str = "") -> list:
        entry = [text, style]
        self.lines.append(entry)
        return entry

    def update(self, event: dict) -> str | None:
        """Fold ``event`` in; return the line it added or amended, if any."""
        if not isinstance(event, dict):
            return None
        self.events.append(event)
        ev, t = event.get("event"), event.get("t")
        if ev == Event.START:
            cfg = event.get("config") or {}
            if cfg and not self.config:  # built before the start line was read
                self.__init__(cfg, lines=self.lines.maxlen or MAX_LINES)
                self.events.append(event)
            return None
        if ev == Event.COMMIT:
            k = event.get("step")
            if isinstance(k, int) and (self.step is None or k >= self.step):
                self.step = k
                if isinstance(event.get("loss"), (int, float)):
                    self.loss = float(event["loss"])
            if isinstance(event.get("gen"), int):
                self.gen = event["gen"]
            members = event.get("members")
            if isinstance(members, list):
                for u in members:
                    if self.status.get(u) not in ("joined",):
                        self.status[u] = "live"
                    self.slot.setdefault(u, u)
                for u, s in list(self.status.items()):
                    if u not in members and s in ("live", "joined"):
                        self.status[u] = "out"  # dropped from the group without a known cause
            return None
        if ev == Event.ALERT:  # the guard's log-only detections: nothing was done about them
            what = event.get("how", "?")
            g = event.get("group")
            detail = f" group {g}" if g is not None else (
                f" node {event['node']}: {event.get('reason', '')}" if what in ("node_health", "node_peers")
                else f" xid {event['code']} ({event.get('action')})" if "code" in event else
                f" {event.get('kind', '')} at step {event.get('step')}")
            return self._add(f"{'':9} ALERT {what}{detail}", "yellow")[0]
        if ev == Event.LADDER:
            how = ("ladder (act):" if event.get("mode") == "act"
                   else "ladder (log-only) would:")
            return self._add(f"{'':9} {how} {event.get('rung')} - "
                             f"{event.get('reason', '')}"[:160], "dim")[0]
        if ev == Event.FAULT:
            g, kind = event.get("group"), event.get("kind", "?")
            if kind == "slow":  # a straggler keeps training (not a death) until masked
                entry = self._add(f"step {event.get('step', '?'):<4} slow group {g}", "bold")
                self._pending[g] = (event, entry)
                return entry[0]
            if kind in RESOLVED_BY:  # the guard answers these (the group stays alive)
                who = "job-wide" if kind == "update" else f"group {g}"
                entry = self._add(f"step {event.get('step', '?'):<4} {kind}"
                                  f"{event.get('code', '') if kind == 'xid' else ''} {who}",
                                  "bold")
                self._answers.setdefault(RESOLVED_BY[kind], []).append((event, entry))
                return entry[0]
            self.status[g] = "hung" if kind == "hang" else "dead"
            entry = self._add(f"step {event.get('step', '?'):<4} {kind} group {g}", "bold")
            self._pending[g] = (event, entry)
            return entry[0]
        if ev == Event.RESOLVED:
            waiting = self._answers.get(event.get("incident"), [])
            if waiting:
                f, entry = waiting.pop(0)
                took = (f" in {t - f['t']:.2f} s" if isinstance(t, (int, float)) and
                        isinstance(f.get("t"), (int, float)) else "")
                entry[0] += f" -> {event.get('how', 'resolved')}{took}"
                entry[1] = "green"
                return entry[0]
            return None
        if ev == Event.DETECTED:
            g, how = event.get("group"), event.get("how", "?")
            if self.status.get(g) != "dead":
                self.status[g] = "hung" if how == "heartbeat" else "dead"
            pend = self._pending.get(g)
            if pend and isinstance(t, (int, float)):
                f, entry = pend
                entry[0] += f", detected by {how} after {t - f.get('t', t):.2f} s"
                return entry[0]
            return self._add(f"{'':9} group {g} detected by {how}", "dim")[0]
        if ev == Event.REPLAN:
            key = ("replan", event.get("step"), event.get("gen"))
            if key in self._seen:
                return None
            self._seen.add(key)
            self.depth = int(event.get("depth", self.depth) or self.depth)
            if isinstance(event.get("gen"), int):
                self.gen = event["gen"]
            what = f"replan (phase {event.get('phase', '?')}, depth {self.depth})"
            members = event.get("members") if isinstance(event.get("members"), list) else None
            hit = [g for g in self._pending if members is None or g not in members]
            if hit:
                out = None
                for g in hit:
                    f, entry = self._pending.pop(g)
                    took = (f" in {t - f['t']:.2f} s" if isinstance(t, (int, float)) and
                            isinstance(f.get("t"), (int, float)) else "")
                    entry[0] += f" -> masked by {what}{took}"
                    entry[1] = "green"
                    out = entry[0]
                return out
            return self._add(f"step {event.get('step', '?'):<4} {what}: "
                             f"{event.get('reason', '')}", "yellow")[0]
        if ev == Event.WIPEOUT:
            key = ("wipeout", event.get("step"))
            if key in self._seen:
                return None
            self._seen.add(key)
            lost = event.get("lost_types", [])
            for g, (f, entry) in list(self._pending.items()):
                entry[0] += " -> wipe-out"
                entry[1] = "red"
                del self._pending[g]
            return self._add(f"step {event.get('step', '?'):<4} WIPE-OUT: lost shard types "
                             f"{lost} ({event.get('reason', '')})", "bold red")[0]
        if ev == Event.RESTART:
            self.depth = 1
            if isinstance(event.get("step"), int):  # training resumes at this step
                self.step = event["step"] - 1 if event["step"] > 0 else None
            ready = event.get("t_ready")
            took = (f", ready in {ready - t:.2f} s" if isinstance(ready, (int, float)) and
                    isinstance(t, (int, float)) else "")
            return self._add(f"restart at step {event.get('step', '?')} from "
                             f"{event.get('source', 'memory')}{took}", "bold magenta")[0]
        if ev == Event.JOIN:
            u, s = event.get("uid"), event.get("slot")
            self.status[u] = "joined"
            if isinstance(s, int):
                self.slot[u] = s
            return self._add(f"step {event.get('step', '?'):<4} spare group {u} joined as "
                             f"slot {s}", "blue")[0]
        if ev == Event.ROLL_FORWARD:
            key = ("roll", event.get("step"))
            if key in self._seen:
                return None
            self._seen.add(key)
            return self._add(f"step {event.get('step', '?'):<4} roll forward", "dim")[0]
        if ev == Event.STOP_REQUESTED:
            return self._add(f"{'':9} {event.get('signal', 'stop')}: every member stops after "
                             f"the next committed step, with a checkpoint", "bold yellow")[0]
        if ev == Event.QUARANTINE:
            return self._add(f"{'':9} group {event.get('group')} quarantined (repeat "
                             f"offender: never restarted in place)", "yellow")[0]
        if ev == Event.RESTART_REQUESTED:
            wait = event.get("backoff_s") or 0
            return self._add(f"{'':9} restart from the checkpoint: {event.get('reason', '')}"
                             + (f" (after {wait:g} s)" if wait else ""), "bold magenta")[0]
        if ev == Event.END:
            w = event.get("wall_s")
            return self._add("done" + (f" in {w:.1f} s" if isinstance(w, (int, float))
                                       else ""), "bold")[0]
        return None

    def ettr(self) -> float | None:
        """ETTR so far (recomputed only when events arrived since the last call)."""
        n = len(self.events)
        if self._ettr[0] != n:
            r = ettr_report(self.events)
            self._ettr = (n, r.ettr if r.series else None)
        return self._ettr[1]

    # -- rendering -------------------------------------------------------------------------
    def _boxes(self) -> Text:
        out = Text()
        # a slot's current occupant last: a spare that joined slot s follows the group it replaced
        order = sorted(self.status, key=lambda u: (self.slot.get(u, u), u))
        for u in order:
            s = self.status[u]
            slot = self.slot.get(u, u)
            name = f"g{u}" if slot == u else f"g{u}@{slot}"
            label = {"joined": "spare"}.get(s, s)
            out.append(f" {name} {label} ", style=_STYLE.get(s, ""))
            out.append(" ")
        return out

    def __rich__(self):
        done = 0 if self.step is None else self.step + 1
        head = Table.grid(padding=(0, 2))
        for _ in range(6):
            head.add_column()
        e = self.ettr()
        head.add_row(
            Text(f"step {done}/{self.total or '?'}", style="bold"),
            ProgressBar(total=max(self.total, 1), completed=done, width=30),
            Text(f"loss {self.loss:.4f}" if self.loss is not None else "loss -"),
            Text(f"gen {self.gen}"),
            Text(f"stack depth {self.depth}"),
            Text(f"ETTR {100 * e:.1f}%" if e is not None else "ETTR -"),
        )
        story = Text()
        for i, (line, style) in enumerate(self.lines):
            if i:
                story.append("\n")
            story.append(line, style=style)
        cfg = self.config
        title = (f"unbroken demo: {cfg.get('groups', '?')} groups, "
                 f"r={cfg.get('redundancy', '?')}")
        return Panel(Group(head, Text("groups  ") + self._boxes(), story or Text("-")),
                     title=title, title_align="left")
