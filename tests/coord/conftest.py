"""A real 3-member etcd cluster for the coordinator's tests (``unbroken.testing.etcd_cluster``),
one per module, always torn down; skipped, naming why, only when no etcd binary is installed
(``make test`` installs Debian's etcd-server)."""

from __future__ import annotations

import pytest

from unbroken.testing.etcd_cluster import EtcdCluster, etcd_binary


@pytest.fixture(scope="module")
def etcd3(tmp_path_factory):
    if etcd_binary() is None:
        pytest.skip("no etcd binary (Debian package etcd-server; `make test` installs it)")
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), n=3) as c:
        yield c


@pytest.fixture
def cluster(etcd3):
    """The module's cluster with every member up again after the test (one may be killed)."""
    yield etcd3
    down = [i for i in range(etcd3.n) if etcd3.procs[i] is None]
    for i in down:
        etcd3.restart(i, wait=False)
    if down:
        etcd3.wait_healthy(list(range(etcd3.n)))
