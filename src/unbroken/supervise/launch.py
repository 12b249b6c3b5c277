"""The cluster an attempt runs on: local processes (:class:`~unbroken.supervise.local.
StackedCluster`) or node agents (:class:`~unbroken.nodes.cluster.NodeCluster`), with the
schedule's faults not injected yet handed to their victims."""

from __future__ import annotations

import os
from pathlib import Path

from unbroken.core.faults import Fault, holder_faults
from unbroken.supervise.spec import JobSpec

__all__ = ["make_cluster", "TEST_FAULTS_ENV"]

#: a test's faults for the local clusters a supervisor starts -- not a standby's; of them only
#: the pace (``pace_s``) reaches node agents' workers (JSON:
#: ``unbroken.testing.faults.cluster_faults``)
TEST_FAULTS_ENV = "UNBROKEN_TEST_FAULTS"


def make_cluster(cfg, jdir: Path, spares: int, spec: JobSpec, ckdir: Path, *, resume: bool,
                 pending: list[Fault], directory=None, extra_argv: list[str] = (),
                 adopt_from: int | None = None, store_host=None):
    """The cluster for one attempt; the victims inject ``pending`` faults (the ones not
    injected by an earlier attempt) themselves, each process its slot's share
    (``core.faults.holder_faults``; a spare gets its share when assigned)."""
    from unbroken.supervise.local import StackedCluster

    drill = {g: holder_faults(pending, g) for g in range(cfg.groups)}
    kw = dict(spares=spares, heartbeat=spec.ft.heartbeat,
              staleness=spec.ft.staleness, ckpt_dir=str(ckdir),
              ckpt_every=spec.ckpt_interval(), resume=resume,
              drill={g: [(f.kind, f.step) for f in fs] for g, fs in drill.items() if fs},
              verdicts=spec.ft.guard == "act", store_process=True,
              supervisor_staleness=spec.ft.supervisor_staleness)
    if store_host is not None:  # a standby's store, started while it stood by
        kw.update(store_host=store_host[0], store_port=store_host[1],
                  store_client=store_host[2])  # (handle, port, a client connected then)
    test = {}
    if adopt_from is None and os.environ.get(TEST_FAULTS_ENV):
        from unbroken.testing.faults import cluster_faults  # (a plain run never imports it)

        test = cluster_faults(os.environ[TEST_FAULTS_ENV], TEST_FAULTS_ENV)
    if directory is not None:  # the same surface, the workers under node agents
        from unbroken.core.nodes import on_live_nodes
        from unbroken.nodes.cluster import NodeCluster

        # a restart places the groups on the nodes still live (a lost one stays fenced)
        node_of, _warning = on_live_nodes(cfg.groups, spec.ft.redundancy, directory.live())
        return NodeCluster(cfg, str(jdir), directory=directory, node_of=node_of,
                           out=str(Path(spec.out).resolve()),
                           node_staleness=spec.ft.node_staleness, adopt_from=adopt_from,
                           extra_argv=list(extra_argv),
                           **kw, **{k: v for k, v in test.items() if k == "pace_s"})
    return StackedCluster(cfg, str(jdir), adopt_from=adopt_from, extra_argv=list(extra_argv),
                          **kw, **test)
