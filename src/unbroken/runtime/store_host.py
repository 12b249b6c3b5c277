"""Host the coordinator's TCPStore in a process of its own.

Started by a launcher through :mod:`unbroken.spawn` (``StackedCluster(store_process=True)``),
it tells the launcher its port and serves until it is killed or its launcher dies (the fork
server it came from exits with the launcher, and this process holds ``PR_SET_PDEATHSIG`` on
it): a store that outlived its supervisor would keep workers waiting on nobody. As
``python -m unbroken.runtime.store_host`` it prints the port on its first stdout line instead.
A launcher that wants its store to outlive a stopped launcher (or a test that kills the
coordinator on purpose) runs the store here instead of in-process.

:func:`serve_store` is how every coordinator store of the job is made, here or in-process. Why
not plain ``TCPStore(is_master=True)``: torch's libuv server listens on a dual-stack IPv6
socket, sees a local client as ``::ffff:127.0.0.1`` and formats each new peer's address with a
reverse DNS lookup *on its event loop* (``LibUVStoreDaemon::onConnect`` -> ``getnameinfo``).
``/etc/hosts`` does not answer for a v4-mapped address, so the lookup goes to the DNS server,
and a slow or silent one (5 s per try here) stops every other client of the store meanwhile:
16 members re-attaching at once to a standby's store waited 10-15 s for their connects
(gdb on the store: ``res_send`` under ``onConnect``). On an IPv4 socket the peer is
``127.0.0.1`` (or the node's address), which ``/etc/hosts`` answers.
"""

from __future__ import annotations

import signal
import socket
import sys
from datetime import timedelta

__all__ = ["serve_store", "main"]


def serve_store(port: int = 0, timeout: float = 60.0):
    """The master ``TCPStore`` on an IPv4 socket listening on every interface at ``port``
    (0: any free one); the store owns the socket."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen(4096)
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout), master_listen_fd=sock.detach())


def main(argv: list[str] | None = None) -> None:
    """``argv``: ``[PORT]`` to serve on a given port (a node directory's, which agents on
    other machines are given); default: any free one. It listens on every interface."""
    from unbroken import spawn

    argv = sys.argv[1:] if argv is None else argv
    store = serve_store(int(argv[0]) if argv else 0)
    if not spawn.tell(store.port):
        print(store.port, flush=True)
    while True:
        signal.pause()  # serve from the store's own thread until a signal ends us


if __name__ == "__main__":
    sys.exit(main())
