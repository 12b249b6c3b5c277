"""Host the coordinator's TCPStore in a process of its own.

Started by a launcher through :mod:`unbroken.spawn` (``StackedCluster(store_process=True)``),
it tells the launcher its port and serves until it is killed or its launcher dies (the fork
server it came from exits with the launcher, and this process holds ``PR_SET_PDEATHSIG`` on
it): a store that outlived its supervisor would keep workers waiting on nobody. As
``python -m unbroken.runtime.store_host`` it prints the port on its first stdout line instead.
A launcher that wants its store to outlive a stopped launcher (or a test that kills the
coordinator on purpose) runs the store here instead of in-process.
"""

from __future__ import annotations

import signal
import sys
from datetime import timedelta


def main(argv: list[str] | None = None) -> None:
    """``argv``: ``[PORT]`` to serve on a given port (a node directory's, which agents on
    other machines are given); default: any free one. It listens on every interface."""
    import torch.distributed as dist

    from unbroken import spawn

    argv = sys.argv[1:] if argv is None else argv
    port = int(argv[0]) if argv else 0
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    if not spawn.tell(store.port):
        print(store.port, flush=True)
    while True:
        signal.pause()  # serve from the store's own thread until a signal ends us


if __name__ == "__main__":
    sys.exit(main())
