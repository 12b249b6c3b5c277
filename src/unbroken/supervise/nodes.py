"""The job's node directory for the job's whole life (``unbroken.nodes.directory``).

``--local-nodes K`` starts K agents here, ``--nodes K`` waits for K agents elsewhere; either
way the directory outlives every attempt of the job (a restart keeps its agents) and is ended
exactly once: the agents exit 0 when the job is over, or print the setup error and exit 2 when
the job cannot run on these nodes. Kept out of the supervisor's loop so the loop only runs
attempts.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Callable, Iterator

from unbroken.supervise.spec import JobSpec

__all__ = ["job_nodes", "node_directory", "reachable_host"]


def node_directory(spec: JobSpec, agent_flags: str | None = None):
    """The job's directory and, with ``--nodes``, the line telling the operator what to run on
    each node (``agent_flags``: how its agents find it, by default ``--coordinator
    HOST:PORT``); (None, None) when the job runs without node agents."""
    if not (spec.local_nodes or spec.nodes):
        return None, None
    from unbroken.core.nodes import place_groups
    from unbroken.nodes.directory import NodeDirectory

    k = spec.local_nodes or spec.nodes
    node_of, _warning = place_groups(spec.groups, spec.ft.redundancy, k)
    d = NodeDirectory(k, port=spec.listen, local=bool(spec.local_nodes),
                      slots=[node_of.count(i) for i in range(k)],
                      heartbeat=spec.ft.heartbeat)
    if not spec.nodes:
        return d, None
    flags = agent_flags or f"--coordinator {reachable_host()}:{d.port}"
    return d, f"waiting for {k} node agents: unbroken agent {flags} on each node"


def reachable_host() -> str:
    """This machine's address on the default route (a UDP connect sends nothing): where
    agents on other machines reach the directory."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.254", 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


@contextmanager
def job_nodes(spec: JobSpec, emit_line: Callable[[str], None], coordinator=None) -> Iterator:
    """The directory (or None) for the ``with`` body; ended and closed whatever happens after
    it was built. ``coordinator`` (``--store etcd://``): the directory's address is published
    in etcd, where agents started with ``--store`` find it (and a standby's, after a takeover). A ``NodeSetupError`` (the agents cannot run this job) is passed to the
    agents, which print it and exit 2; anything else ends them without one (``NodeStartError``
    -- they did not come -- propagates for the caller to report)."""
    from unbroken.nodes.directory import NodeSetupError

    directory, line = node_directory(
        spec, coordinator.agent_flags() if coordinator is not None else None)
    if directory is None:
        yield None
        return
    try:
        if coordinator is not None:
            coordinator.publish_directory(reachable_host() if spec.nodes else "127.0.0.1",
                                          directory.port)
        if line is not None:
            emit_line(line)
        yield directory
    except BaseException as exc:
        directory.end(str(exc) if isinstance(exc, NodeSetupError) else None)
        raise
    finally:
        directory.close()
