"""Follow one etcd record until it names a coordinator of another epoch.

Why a file of its own: two kinds of process outlive their coordinator and learn where its
successor is from etcd -- a member re-attaching to the new attempt's store
(``runtime.reattach``, the job's ``store_addr``) and a node agent re-claiming its node in the
new coordinator's directory (``nodes.agent --store``, the job's ``directory``). Both wait the
same way: read the record and, while it still names the epoch they had, watch the key from
the revision after the read, so etcd answers the moment the successor publishes. Without a
quorum nobody can take over either: a short retry interval, no guessing.
"""

from __future__ import annotations

import json
import time

from unbroken.coord.etcd import Etcd, EtcdError

__all__ = ["wait_new_epoch"]

WATCH_S = 2.0   # one watch's length: a follower watching a cut-off etcd member re-reads
RETRY_S = 0.25  # etcd down; 16 members retrying every 50 ms kept a 2-core etcd too busy


def wait_new_epoch(etcd: Etcd, key: str, epoch: str | None, timeout: float) -> dict | None:
    """The record at ``key`` (a JSON object with an ``epoch``) once its epoch is not
    ``epoch`` (None: any record), or None when ``timeout`` s pass first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kv, rev = etcd.get_at(key)
        except EtcdError:
            kv, rev = None, 0
        if kv is not None:
            try:
                rec = json.loads(kv.value)
            except ValueError:
                rec = None  # not ours to read: wait for the next write
            if isinstance(rec, dict) and (epoch is None or str(rec.get("epoch")) != epoch):
                return rec
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if rev:  # returns at the change; the read above then takes it
            etcd.watch(key, rev + 1, min(WATCH_S, left))
        else:
            time.sleep(min(RETRY_S, left))  # a retry interval, not a synchronisation
