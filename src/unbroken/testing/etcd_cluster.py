"""A real etcd cluster of N members on free local ports, for tests and benches.

Why here: the coordinator's durable state (``unbroken.coord``) is only believable against the
real engine: real Raft, real leases, real quorum loss. This starts the ``etcd`` binary (Debian
``etcd-server``, installed by ``make test``) N times with short heartbeats and elections so a
member loss is handled in about a second, and can SIGKILL a member and restart it on its data
directory (it rejoins as itself). :func:`etcd_binary` is None when etcd is not installed (the
tests then skip, naming why).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

__all__ = ["EtcdCluster", "etcd_binary"]


def etcd_binary() -> str | None:
    return shutil.which("etcd") or next((p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd")
                                         if os.access(p, os.X_OK)), None)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class EtcdCluster:
    """``with EtcdCluster(tmp_path, n=3) as c``: ``c.endpoints`` ("127.0.0.1:PORT" each),
    ``c.url`` (``etcd://...`` for ``--store``), ``c.kill(i)``, ``c.restart(i)``."""

    def __init__(self, root: Path, n: int = 3, token: str = "unbroken-test") -> None:
        self.root, self.n, self.token = Path(root), n, token
        ports = _free_ports(2 * n)
        self.client_ports, self.peer_ports = ports[:n], ports[n:]
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.initial = ",".join(f"m{i}=http://127.0.0.1:{p}"
                                for i, p in enumerate(self.peer_ports))

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(self.endpoints)

    def _start(self, i: int) -> None:
        c, p = self.client_ports[i], self.peer_ports[i]
        log = open(self.root / f"etcd-m{i}.log", "ab")
        self.procs[i] = subprocess.Popen(
            [etcd_binary(), "--name", f"m{i}", "--data-dir", str(self.root / f"etcd-m{i}"),
             "--listen-client-urls", f"http://127.0.0.1:{c}",
             "--advertise-client-urls", f"http://127.0.0.1:{c}",
             "--listen-peer-urls", f"http://127.0.0.1:{p}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
             "--initial-cluster", self.initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", self.token,
             # fast failure detection on one machine: a lost leader is replaced in ~0.5 s
             "--heartbeat-interval", "50", "--election-timeout", "500"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def healthy(self, i: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoints[i]}/health", timeout=0.5) as r:
                return b'"true"' in r.read()
        except OSError:
            return False

    def wait_healthy(self, members: list[int], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(self.healthy(i) for i in members):
            for i in members:
                proc = self.procs[i]
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"etcd member m{i} exited {proc.returncode}: "
                                       f"{(self.root / f'etcd-m{i}.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd members {members} not healthy in {timeout} s")
            time.sleep(0.05)  # polling a health endpoint with a deadline

    def start(self) -> "EtcdCluster":
        for i in range(self.n):
            self._start(i)
        self.wait_healthy(list(range(self.n)))
        return self

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its data directory stays: :meth:`restart` brings it back)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self.procs[i] = None

    def restart(self, i: int, wait: bool = True) -> None:
        self._start(i)
        if wait:
            alive = [k for k in range(self.n) if self.procs[k] is not None]
            self.wait_healthy(alive)

    def close(self) -> None:
        for i in range(self.n):
            self.kill(i)

    def __enter__(self) -> "EtcdCluster":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
