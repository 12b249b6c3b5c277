"""Host the coordinator's TCPStore in a process of its own.

``python -m unbroken.runtime.store_host`` prints the port on its first stdout line and serves
until it is killed. A launcher that wants its store to outlive itself (or a test that wants to
kill the coordinator on purpose) runs the store here instead of in-process.
"""

from __future__ import annotations

import signal
import sys
from datetime import timedelta


def main() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    print(store.port, flush=True)
    while True:
        signal.pause()  # serve from the store's own thread until a signal ends us


if __name__ == "__main__":
    sys.exit(main())
