"""Start worker processes by forking a server that has imported torch once.

Why: importing torch costs about 2 s of CPU per process on this kind of host. A job starts one
process per group plus its warm spares, and a retry in place or a restart starts fresh ones;
with plain ``python -m ...`` every one of them paid that import, so on a busy 2-core host a
4-group job spent ~9 s before its first step and a replacement took seconds to become warm.
A fork server (``python -m unbroken.spawn``, one per launcher process, started at the first
:func:`start`) imports :data:`PRELOAD` once and forks each worker from that warm,
single-threaded process: a start costs a fork and the worker's own set-up, not an import.
(multiprocessing's forkserver does the same but re-runs the launcher's ``__main__`` in every
child, which breaks a user's script without a main guard; this server runs only the entry.)

Contract the launchers rely on (``LocalCluster``, ``StackedCluster``, the supervisor):

* :func:`start` returns a :class:`Worker` with the ``subprocess.Popen`` surface they use:
  ``pid``, ``returncode`` (negative signal number when a signal ended it; set by ``poll`` /
  ``wait``), ``poll()``, ``wait(timeout)`` raising :class:`subprocess.TimeoutExpired`,
  ``send_signal``, ``kill`` (a no-op once it has exited), plus ``sentinel``: a file
  descriptor that becomes readable when the process has ended (what
  :class:`unbroken.procwait.ExitWaiter` sleeps on).
* The worker runs ``entry(argv)`` in a process group of its own (a terminal's Ctrl-C reaches
  the launcher only) but in the launcher's session: with Linux's autogroup scheduling every
  session is one scheduling entity, and a worker in a session of its own had its whole
  process, heartbeat thread included, held off the CPU for 0.4-1.4 s after it ran ahead of
  its share on a loaded machine (its peers then left it out as hung; the soak under a busy
  loop: 6 false hangs in 21 runs, none in 26 since). Its environment and working directory
  are the launcher's *as they are at the call* plus ``env`` (``PYTHONPATH`` included: it
  imports what ``python -m`` started there would), stdout to /dev/null and stderr appended to
  ``stderr_path``; it leaves with ``os._exit``.
* It dies with its launcher while it starts up: the server exits when the launcher goes (its
  socket closes; ``PR_SET_PDEATHSIG`` covers a SIGKILL), and the worker holds
  ``PR_SET_PDEATHSIG`` on the server until the entry clears it (``pdeathsig(0)``) once it is
  connected and can stop cleanly by itself.
* Nothing of the launcher's own state (threads, locks, sockets) reaches the worker: the server
  is a fresh interpreter that only imported :data:`PRELOAD`.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Any, Sequence

from unbroken.procwait import close_quietly, readable

__all__ = ["PRELOAD", "Worker", "start", "warm", "wait_warm", "pdeathsig", "tell", "fork_server",
           "quick_resolver", "steady_malloc"]

#: what the server imports once (torch dominates; the rest is the workers' import graph)
#: torch._dynamo: a torch.optim optimizer imports it on construction (~1.3 s of CPU per
#: worker otherwise); it starts no thread, so the server stays safe to fork
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "unbroken.runtime.stacked",
           "unbroken.runtime.ftcomm", "unbroken.runtime.stacked_worker",
           "unbroken.runtime.ftcomm_worker")

_LEN = struct.Struct("!I")
_STATUS = struct.Struct("!i")
_READY = b"W"  # the server's first byte: its PRELOAD is imported
_channel_fd: int | None = None  # in a worker started with ``channel=True``: its end of the pipe


def pdeathsig(sig: int) -> None:
    """``PR_SET_PDEATHSIG``: the kernel sends ``sig`` to this process when its parent thread
    ends (0 clears it). Linux only; elsewhere the store's loss still stops a worker."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def tell(obj: Any) -> bool:
    """In a worker started with ``channel=True``: send ``obj`` (JSON) to the launcher
    (:meth:`Worker.receive`). False when there is no channel (started some other way)."""
    if _channel_fd is None:
        return False
    os.write(_channel_fd, (json.dumps(obj) + "\n").encode())
    return True


# ------------------------------------------------------------------ the launcher's side
class Worker:
    """A process started by :func:`start`, with the ``Popen`` surface the launchers use."""

    def __init__(self, pid: int, sentinel: int, args: Sequence[str],
                 channel: int | None) -> None:
        self.pid, self.sentinel, self.args = pid, sentinel, list(args)
        self._channel = channel
        self.returncode: int | None = None
        # the status is read once: a second reader (the supervisor's loop while a dump thread
        # kills a hung member) would find EOF and take the exit for an unknown one (255)
        self._collecting = threading.Lock()

    def poll(self) -> int | None:
        if self.returncode is None and readable([self.sentinel], 0):
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not readable([self.sentinel], timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._collect()
        return self.returncode

    def _collect(self) -> None:
        with self._collecting:
            if self.returncode is None:
                self._read_status()

    def _read_status(self) -> None:
        data = os.read(self.sentinel, _STATUS.size)
        # the server writes the status when it reaps the worker; nothing (EOF) when the server
        # itself died first: the exit is unknown, as multiprocessing reports it
        self.returncode = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else 255

    def __del__(self) -> None:
        close_quietly(self.sentinel, self._channel)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended a moment ago; the next poll says how
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def receive(self, timeout: float) -> Any:
        """The first object the worker sent with :func:`tell`; ``TimeoutError``, or
        ``EOFError`` when it ended without sending."""
        buf = b""
        while not buf.endswith(b"\n"):
            if not readable([self._channel], timeout):
                raise TimeoutError(f"nothing from {self.args[0]} within {timeout}s")
            chunk = os.read(self._channel, 4096)
            if not chunk:
                raise EOFError(f"{self.args[0]} ended without a word")
            buf += chunk
        return json.loads(buf.split(b"\n", 1)[0])


class _Server:
    """The launcher's handle on its fork server: one request, one pid, over a unix socket."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, OMP_NUM_THREADS="1")  # one torch thread per worker
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from unbroken.spawn import _serve; "
                                   "_serve(int(sys.argv[1]))", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = mine
        self.lock = threading.Lock()
        self.warm = False  # its PRELOAD imported (the _READY byte read)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_warm(self, timeout: float | None) -> bool:
        """Block (up to ``timeout`` s; the caller holds ``lock``) until the server has
        imported :data:`PRELOAD`: True, False on a timeout or a dead server."""
        if not self.warm and readable([self.sock], timeout):
            self.warm = _recv_exact(self.sock, len(_READY)) == _READY
        return self.warm

    def start(self, request: dict, fds: list[int]) -> int:
        payload = pickle.dumps(request)
        with self.lock:
            self.wait_warm(None)
            socket.send_fds(self.sock, [_LEN.pack(len(payload)) + payload], fds)
            reply = _recv_exact(self.sock, _STATUS.size)
        if len(reply) != _STATUS.size:
            raise RuntimeError(f"the fork server is gone (rc {self.proc.poll()})")
        pid = _STATUS.unpack(reply)[0]
        if pid < 0:
            raise OSError(-pid, os.strerror(-pid))
        return pid


class _ForkedServer(_Server):
    """A fork server forked from this process (:func:`fork_server`), not a fresh interpreter."""

    def __init__(self) -> None:  # noqa: D107 - no super(): nothing is exec'd
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            mine.close()
            try:
                _serve(theirs.detach())
            finally:
                os._exit(0)
        theirs.close()
        self.pid, self.sock, self.lock = pid, mine, threading.Lock()
        self.warm = False
        self.code: int | None = None

    def alive(self) -> bool:
        if self.code is None and os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:
            self.code = 1
        return self.code is None


_server: _Server | None = None
_server_lock = threading.Lock()


def fork_server() -> None:
    """Make this process's fork server a fork of itself: for a process that has imported
    :data:`PRELOAD` already and has no thread yet (a node agent), so its workers start
    without a second ~2 s torch import. The server ends with this process (its socket closes)."""
    global _server
    with _server_lock:
        if _server is None:
            _server = _ForkedServer()


def wait_warm(timeout: float) -> bool:
    """Start this process's fork server if it is not, and wait up to ``timeout`` s for its
    imports: True once a :func:`start` costs a fork, not an import. A standby supervisor
    waits for this before it says it stands by: a takeover must not pay the import."""
    warm()
    with _server_lock:
        server = _server
    with server.lock:
        return server.wait_warm(timeout)


def warm() -> None:
    """Start this process's fork server now, without waiting for it: its imports (~3 s of
    CPU) then overlap what the launcher does before its first :func:`start`, such as
    building the user's trainer to check it."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive():
            _server = _Server()


#: glibc resolver options of every process started here, unless the user set RES_OPTIONS.
#: torch's TCPStore client formats its socket's address with a reverse DNS lookup at each
#: connect and on each error (``c10d::detail::formatSockAddr`` -> ``getnameinfo``); a client
#: connected to ``127.0.0.1`` has the v4-mapped ``::ffff:127.0.0.1``, which ``/etc/hosts`` does
#: not answer, so every connect asks the DNS server. One query of a burst dropped (here 1 in
#: ~40) cost that connect 5 s, the resolver's default timeout: 16 members re-attaching to a
#: standby's store waited 5-10 s for a log line. A dropped query now costs 1 s.
RESOLVER_OPTIONS = "timeout:1 attempts:2"


def quick_resolver() -> None:
    """This process's own resolver as :data:`RESOLVER_OPTIONS` (unless set): glibc reads
    ``RES_OPTIONS`` when the process first resolves, so call it before the first store."""
    os.environ.setdefault("RES_OPTIONS", RESOLVER_OPTIONS)


def start(entry: str, argv: Sequence[str], *, stderr_path: str,
          env: dict[str, str] | None = None, channel: bool = False) -> Worker:
    """Run ``entry`` (``"package.module:function"``, called with ``argv``) in a new process
    forked from the preloaded server; see the module docstring for what it gets. ``channel``:
    a one-way pipe from the worker (:func:`tell`) to the launcher (:meth:`Worker.receive`)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive():
            _server = _Server()
        server = _server
    full = {**os.environ, **(env or {})}
    full.setdefault("RES_OPTIONS", RESOLVER_OPTIONS)
    full.pop("UNBROKEN_PARENT_PID", None)
    status_r, status_w = os.pipe()
    chan_r, chan_w = os.pipe() if channel else (None, None)
    try:
        pid = server.start({"entry": entry, "argv": list(argv), "env": full, "cwd": os.getcwd(),
                            "stderr": stderr_path, "channel": channel},
                           [status_w] + ([chan_w] if channel else []))
    except BaseException:
        for fd in (status_r, chan_r):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        os.close(status_w)  # the server holds its own copies now
        if chan_w is not None:
            os.close(chan_w)
    return Worker(pid, status_r, [entry, *argv], chan_r)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


# ------------------------------------------------------------------ the server
#: glibc malloc's thresholds (bytes) in the server, hence in every worker forked from it:
#: see :func:`steady_malloc`. 32 MiB is the ceiling of glibc's own dynamic threshold.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20


def steady_malloc() -> bool:
    """Fix glibc malloc's mmap and trim thresholds (:data:`MMAP_THRESHOLD`,
    :data:`TRIM_THRESHOLD`) unless the user set ``MALLOC_MMAP_THRESHOLD_`` or
    ``MALLOC_TRIM_THRESHOLD_``, or ``UNBROKEN_STEADY_MALLOC=0``: True if set.

    Why: by default glibc serves a block over its *dynamic* mmap threshold with a fresh
    ``mmap`` and gives it back on free, and trims the heap's free top; the next step's tensors
    then fault their pages in again, zeroed by the kernel. A worker forked from this server
    inherits the threshold the server's imports left, and there a GPT gradient step of
    ``bench/train_bars.py`` took ~380 minor faults and 0.6 ms of system time (~3 % of its
    22 ms) against ~260 in a fresh process. With these thresholds: ~5 faults and no system
    time (medians of 5 alternated runs: 21.9 ms of thread CPU forked, 21.7 fresh; 22.3 forked
    before). The cost: up to ``TRIM_THRESHOLD`` of freed heap stays mapped in each worker."""
    if (os.environ.get("UNBROKEN_STEADY_MALLOC") == "0" or "MALLOC_MMAP_THRESHOLD_" in os.environ
            or "MALLOC_TRIM_THRESHOLD_" in os.environ):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                    and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError):  # not glibc: its own allocator's defaults
        return False


def _serve(fd: int) -> None:
    # no PR_SET_PDEATHSIG here: it follows the launcher's *thread*; the socket closes with
    # the launcher's process, however it ends, and that ends this loop
    me = os.getpid()
    steady_malloc()
    sock = socket.socket(fileno=fd)
    try:  # finds the argv area now, while the environment is the one the process began with
        import setproctitle  # noqa: F401
    except ImportError:
        pass
    for mod in PRELOAD:
        importlib.import_module(mod)
    try:
        sock.sendall(_READY)  # warm: the launcher may say so (wait_warm)
    except OSError:  # the launcher is gone (a bad flag ended it while this imported)
        os._exit(0)
    status_of: dict[int, int] = {}  # pid -> the write end of its status pipe
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through wake_w
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the launcher's
    while True:
        try:
            ready = readable([sock, wake_r], None)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(status_of)
        if sock not in ready:
            continue
        head, fds, _flags, _addr = socket.recv_fds(sock, _LEN.size, 2)
        if len(head) < _LEN.size:  # the launcher is gone: so are we
            os._exit(0)
        req = pickle.loads(_recv_exact(sock, _LEN.unpack(head)[0]))
        try:
            pid = os.fork()
        except OSError as exc:
            for x in fds:
                os.close(x)
            sock.sendall(_STATUS.pack(-(exc.errno or errno.EAGAIN)))
            continue
        if pid == 0:
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            for w in status_of.values():
                os.close(w)
            os.close(fds[0])
            sock.close()
            _child(req, fds[1] if req["channel"] else None, me)
        status_of[pid] = fds[0]
        if req["channel"]:
            os.close(fds[1])
        sock.sendall(_STATUS.pack(pid))


def _reap(status_of: dict[int, int]) -> None:
    while status_of:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        w = status_of.pop(pid, None)
        if w is not None:
            os.write(w, _STATUS.pack(os.waitstatus_to_exitcode(status)))
            os.close(w)


def _title(cmdline: list[str]) -> None:
    """Show the command line the worker would have had as ``python -m MODULE ARGS`` (ps,
    pgrep -f and /proc/PID/cmdline find a group by its ``--uid`` as before)."""
    try:
        import setproctitle

        setproctitle.setproctitle(" ".join(cmdline))
    except ImportError:  # the short name at least (15 bytes, what top and pgrep show)
        try:
            import ctypes

            name = f"unbroken-{cmdline[2].rsplit('.', 1)[-1]}"[:15].encode()
            ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
        except (OSError, AttributeError):
            pass


def _child(req: dict, channel: int | None, server: int) -> None:
    global _channel_fd
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setpgid(0, 0)
        pdeathsig(signal.SIGKILL)
        if os.getppid() != server:  # the server died before the line above
            os._exit(5)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        os.close(err)
        os.close(null)
        mod, _, fn = req["entry"].partition(":")
        _title([sys.executable, "-m", mod, *req["argv"]])  # before the environment changes
        os.environ.clear()
        os.environ.update(req["env"])
        # what a fresh ``python -m`` in the launcher's directory would import from: its cwd
        # (the server's sys.path[0] is '') and the PYTHONPATH it is given
        os.chdir(req["cwd"])
        sys.path[1:1] = [os.path.abspath(p) for p in req["env"].get("PYTHONPATH", "").split(
            os.pathsep) if p and os.path.abspath(p) not in sys.path]
        _channel_fd = channel
        getattr(importlib.import_module(mod), fn)(req["argv"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

