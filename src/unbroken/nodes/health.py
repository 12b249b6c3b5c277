"""What a node agent reports of its machine, besides its heartbeat.

Why the agent: the coordinator sees the groups (their commits, heartbeats and per-process
health) but not the machines under them. A node whose disk fills will fail its next
checkpoint; one whose memory runs out loses its processes to the OOM killer; one shared with
a busy neighbour makes stragglers. And a GPU's XID is written to *that machine's* kernel log,
where the coordinator cannot read it; its pid only names a process on that machine. So each
agent samples its machine once a second (``/proc/loadavg``, ``/proc/meminfo``, ``statvfs`` of
the run directory) and reads its own kernel log (``--xid-log``: ``dmesg`` saved to a file, or
``kern.log``) with the same reader the coordinator uses (``detect.xid_source``), maps each
XID's pid to the worker it started, and posts both to the attempt's store
(``protocol.node_health_key``, ``node_xid_key``). The coordinator journals them
(``node_health``, ``node_xid``) and the guard answers: an XID through the ladder as any
other, machine problems as log-only alerts (``core.nodes.health_problems``).

Cost: one ``/proc`` read, one ``statvfs``, one kernel-log poll and one store write per
second, on the agent's loop (not a training process). A failing probe leaves its signal out
of the sample; it never stops the agent.
"""

from __future__ import annotations

import json
import os
import time
from typing import Mapping

from unbroken.protocol import node_health_key, node_xid_key, node_xids_key

__all__ = ["sample_node", "NodeReporter", "HEALTH_S"]

#: seconds between two samples of a node
HEALTH_S = 1.0


def sample_node(path: str) -> dict:
    """This machine now: ``load1``, ``cpus``, ``mem_avail_mb``, ``mem_total_mb`` and
    ``disk_free_mb`` of the filesystem holding ``path``; a signal that cannot be read is
    left out."""
    out: dict = {"cpus": os.cpu_count() or 1}
    try:
        out["load1"] = os.getloadavg()[0]
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            mem = {k: int(v.split()[0]) for k, v in
                   (line.split(":", 1) for line in f if ":" in line)}
        out["mem_total_mb"] = mem["MemTotal"] / 1024
        out["mem_avail_mb"] = mem.get("MemAvailable", mem.get("MemFree", 0)) / 1024
    except (OSError, KeyError, ValueError):
        pass
    try:
        st = os.statvfs(path)
        out["disk_free_mb"] = st.f_bavail * st.f_frsize / 2**20
    except OSError:
        pass
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


class NodeReporter:
    """Posts node ``node``'s sample and the new XID lines of its kernel log every
    :data:`HEALTH_S` s; :meth:`tick` is called from the agent's loop (it returns at once
    until a sample is due). One reporter follows the agent through the job's attempts
    (:meth:`attach` to each), so a kernel-log line is posted once; the lines already in the
    log when the agent starts are the machine's history, not this job's, and are skipped."""

    def __init__(self, node: int, xid_log: str | None) -> None:
        from unbroken.detect.xid_source import XidSource

        self.node, self.path = node, "."
        self.xid = XidSource(xid_log) if xid_log else None
        while self.xid is not None:  # history: read past it (a poll reads a bounded chunk)
            before = self.xid.offset
            self.xid.poll()
            if self.xid.offset == before:
                break
        self.posted = 0
        self.next_t = 0.0

    def attach(self, path: str) -> None:
        """A new attempt (a new store): its XID records count from 1; ``path``: the run
        directory, whose filesystem's free space is sampled."""
        self.path, self.posted, self.next_t = path, 0, 0.0

    def tick(self, store, pids: Mapping[int, int], workers: int) -> None:
        """``pids``: pid -> uid of the workers this agent started (XID pids are this
        machine's); ``workers``: how many of them run."""
        now = time.monotonic()
        if now < self.next_t:
            return
        self.next_t = now + HEALTH_S
        sample = {**sample_node(self.path), "workers": workers, "t": time.time()}
        if self.xid is not None:
            read = self.xid.poll()
            if read.problems or read.malformed:
                sample["xid_problems"] = (read.problems + [
                    f"line {m.lineno}: {m.error}" for m in read.malformed])[:5]
            for hit in read.hits:
                ev = hit.event
                self.posted += 1
                store.set(node_xid_key(self.node, self.posted), json.dumps(
                    {"uid": pids.get(ev.pid) if ev.pid is not None else None,
                     "pid": ev.pid, "code": ev.code, "action": hit.action,
                     "reason": hit.reason, "pci": ev.pci}))
                store.add(node_xids_key(self.node), 1)
        store.set(node_health_key(self.node), json.dumps(sample))
