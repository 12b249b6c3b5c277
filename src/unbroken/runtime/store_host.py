"""Host the coordinator's TCPStore in a process of its own.

``python -m unbroken.runtime.store_host`` prints the port on its first stdout line and serves
until it is killed, or until its launcher dies when one started it (``UNBROKEN_PARENT_PID``):
a store that outlived its supervisor would keep workers waiting on nobody. A launcher that wants its store to outlive itself (or a test that wants to
kill the coordinator on purpose) runs the store here instead of in-process.
"""

from __future__ import annotations

import signal
import sys
from datetime import timedelta


def main() -> None:
    from unbroken.runtime.stacked_worker import die_with_parent

    die_with_parent()  # launched by a supervisor (UNBROKEN_PARENT_PID): its store dies with it
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    print(store.port, flush=True)
    while True:
        signal.pause()  # serve from the store's own thread until a signal ends us


if __name__ == "__main__":
    sys.exit(main())
