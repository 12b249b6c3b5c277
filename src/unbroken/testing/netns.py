"""A second network stack on this machine, for fault drills: a network namespace joined to
this one by a veth pair. Processes started inside (:meth:`NetNs.prefix`) have their own
interfaces, address and routes, so their connections to this side cross a real link, as
between two machines; :meth:`NetNs.cut` takes the link down -- every packet dropped, nothing
reset, no process told: a node cut off from the network.

Needs root and iproute2; :class:`NetNsUnavailable` (one line) otherwise."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

__all__ = ["NetNs", "NetNsUnavailable"]


class NetNsUnavailable(RuntimeError):
    """No network namespace here (not root, no iproute2, or ``ip`` refused): why, one line."""


class NetNs:
    """Namespace ``ubt<tag>``: this side ``10.X.Y.1/30`` on ``ubh<tag>``, the namespace's
    side ``10.X.Y.2/30`` on ``ubn<tag>`` (``tag`` < 100,000 keeps the names within the
    kernel's 15 characters). :meth:`close` kills what runs inside and removes both."""

    def __init__(self, tag: int) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise NetNsUnavailable("a network namespace needs root and iproute2")
        tag = int(tag) % 100000
        self.name = f"ubt{tag}"
        self.host_if, self.ns_if = f"ubh{tag}", f"ubn{tag}"
        x, y = 200 + tag // 250 % 50, tag % 250
        self.host_addr, self.ns_addr = f"10.{x}.{y}.1", f"10.{x}.{y}.2"
        self._ip("netns", "add", self.name)
        try:
            self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            self._ip("link", "set", self.ns_if, "netns", self.name)
            self._ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
            self._ip("link", "set", self.host_if, "up")
            self.exec_ip("addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if)
            self.exec_ip("link", "set", self.ns_if, "up")
            self.exec_ip("link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise NetNsUnavailable(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def exec_ip(self, *args: str) -> None:
        self._ip("netns", "exec", self.name, "ip", *args)

    def prefix(self) -> list[str]:
        """Run a command inside: ``[*prefix, cmd, ...]``."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        self.exec_ip("link", "set", self.ns_if, "down")

    def close(self) -> None:
        r = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        for pid in r.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
