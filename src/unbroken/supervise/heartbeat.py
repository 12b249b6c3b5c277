"""The supervisor's own heartbeat in the job's store (``SUPERVISOR_HB``): the members stop with a
checkpoint when it goes stale (``--supervisor-staleness``), which is how they learn that the
supervisor's process was stopped or lost."""

from __future__ import annotations

import threading

from unbroken.protocol import SUPERVISOR_HB

__all__ = ["SupervisorHeartbeat"]


class SupervisorHeartbeat:
    """The supervisor's own heartbeat, from a thread with its own store client: it stops when
    the whole process is stopped, which is exactly what the members must notice."""

    def __init__(self, store, period: float, client=None) -> None:
        """``client``: the thread's own client of ``store`` if one was connected ahead (a
        standby's); default: a clone made here."""
        self._stop = threading.Event()
        st = client if client is not None else store.clone()
        st.add(SUPERVISOR_HB, 1)

        def beat() -> None:
            while not self._stop.wait(period):
                try:
                    st.add(SUPERVISOR_HB, 1)
                except Exception:
                    return  # the store host is gone: the members see that themselves
        self._thread = threading.Thread(target=beat, name="supervisor-hb", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
