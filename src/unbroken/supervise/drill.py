"""Fire-drill faults the supervisor side writes itself (``--faults xidN:S@K,update@K,node:I@K``).

The workers inject their own faults at exact steps (kill, hang, slow, stall, nan, flip); two
kinds come from outside a worker in real life and are written here once training reaches
their step: a kernel-log XID line naming the pid that holds a slot (what ``dmesg`` would
show), and a queued code update that breaks the model (``testing.updates``: a real shape bug);
with node agents, a node's loss (its agent killed with every process it started) or its cut
(the agent stopped, its workers running on).
Nothing here runs unless a fault schedule asks for it.
"""

from __future__ import annotations

import time
from typing import Callable

from unbroken.core.faults import Fault
from unbroken.events import Event

__all__ = ["LauncherDrill", "BAD_UPDATE"]

#: the code update the ``update`` fault queues: a real shape bug (testing.updates)
BAD_UPDATE = {"gpt": "unbroken.testing.updates:bad_gpt", "mlp": "unbroken.testing.updates:bad_mlp"}

_XID_TEXT = {79: "GPU has fallen off the bus.", 119: "Timeout after 6s of waiting for RPC "
             "response from GPU0 GSP!", 43: "Ch 00000010", 31: "Ch 00000008, intr 10000000. "
             "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000."}


class LauncherDrill:
    """The pending ``xid`` and ``update`` faults of one attempt."""

    def __init__(self, pending: list[Fault], model: str, xid_log: str | None,
                 emit: Callable[[dict], None], fired: set, guard,
                 kill_node: Callable[[Fault], None] | None = None) -> None:
        self.todo = [f for f in pending if f.kind in ("xid", "update", "node", "cut")]
        self.kill_node = kill_node
        self.updates = sum(1 for f in fired if f.kind == "update")  # versions queued so far
        self.model, self.xid_log, self.emit, self.fired, self.guard = (
            model, xid_log, emit, fired, guard)

    def fire(self, top: int, holder: Callable[[int], tuple[int, int] | None]) -> None:
        """Write every fault whose step training has reached (``top``: the highest committed
        step); ``holder(slot)`` -> (uid, pid) of the live process holding the slot."""
        for f in [f for f in self.todo if f.step <= top]:
            self.todo.remove(f)
            now = time.time()
            if f.kind in ("node", "cut"):  # the supervisor's: it knows which node runs what
                self.kill_node(f)
                continue
            if f.kind == "update":
                # every update a new version (a rolled-back version is never queued again)
                self.updates += 1
                version = f"v{self.updates}"
                model = BAD_UPDATE.get(self.model, BAD_UPDATE["mlp"])
                self.emit({"event": Event.FAULT, "kind": "update", "group": -1, "step": f.step,
                           "at": f.step, "version": version, "model": model, "t": now})
                self.fired.add(f)
                self.guard.queue_update(version, model, now)
                continue
            held = holder(f.group)
            if held is None or self.xid_log is None:
                self.emit({"event": Event.FAULT_SKIPPED, "kind": f.kind, "group": f.group,
                           "step": f.step, "reason": "no live holder of the slot"})
                continue
            uid, pid = held
            bus = f"0000:{f.group + 1:02x}:00"  # local topology: slot s sits on bus s+1
            line = (f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:{bus}): {f.code}, pid={pid}, "
                    f"name=python, {_XID_TEXT.get(f.code, 'injected')}\n")
            self.emit({"event": Event.FAULT, "kind": "xid", "group": f.group, "uid": uid,
                       "step": f.step, "at": f.step, "code": f.code, "t": now})
            self.fired.add(f)
            with open(self.xid_log, "a") as log:
                log.write(line)
