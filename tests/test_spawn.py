"""The fork server (unbroken.spawn): workers forked from a preloaded interpreter keep the
Popen contract the launchers rely on (exit codes, signals, sessions, environment, stderr,
the exit sentinel), start without paying the torch import, and leave with their launcher."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from unbroken import spawn
from unbroken.procwait import ExitWaiter

pytestmark = pytest.mark.mp

ENTRIES = textwrap.dedent('''
    import os, sys, time, json
    from unbroken import spawn

    def report(argv):
        out = {"argv": argv, "sid": os.getsid(0), "pgid": os.getpgid(0), "pid": os.getpid(),
               "cwd": os.getcwd(),
               "env": os.environ.get("SPAWN_TEST"), "torch": "torch" in sys.modules,
               "title": open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode()}
        spawn.tell(out)
        print("to stderr", file=sys.stderr, flush=True)
        sys.exit(int(argv[0]))

    def wait_forever(argv):
        spawn.tell("ready")
        time.sleep(3600)

    def fail(argv):
        raise ValueError("boom")

    def faults_per_round(steady):
        # a step's worth of tensors: eight 1 MiB blocks written, then freed, ten times; the
        # minor page faults per round say whether freed memory went back to the kernel
        import ctypes, resource
        if steady:
            spawn.steady_malloc()
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        def once():
            blocks = [libc.malloc(1 << 20) for _ in range(8)]
            for b in blocks:
                ctypes.memset(b, 1, 1 << 20)
            for b in blocks:
                libc.free(b)
        once(), once()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            once()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 10

    def churn(argv):
        spawn.tell(faults_per_round(False))
''')


@pytest.fixture
def entries(tmp_path, monkeypatch):
    (tmp_path / "spawn_entries.py").write_text(ENTRIES)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the worker imports what python -m would
    return tmp_path


@pytest.mark.timeout(60)
def test_a_worker_gets_argv_env_cwd_its_own_process_group_and_its_exit_code(entries, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("SPAWN_TEST", "at the call")  # after the server may have started
    monkeypatch.chdir(tmp_path)
    err = tmp_path / "stderr"
    w = spawn.start("spawn_entries:report", ["7", "--uid 3"], stderr_path=str(err),
                    channel=True)
    got = w.receive(timeout=30)
    assert w.wait(timeout=30) == 7 and w.returncode == 7
    assert got["argv"] == ["7", "--uid 3"] and got["pid"] == w.pid
    # a process group of its own: a terminal's Ctrl-C is not for it; the launcher's session, so
    # the job's processes share one scheduling group (autogroup): a worker in a session of
    # its own saw its heartbeat thread wait 0.4-1.4 s for the CPU on a loaded machine
    assert got["pgid"] == w.pid and got["sid"] == os.getsid(0)
    assert got["env"] == "at the call" and got["cwd"] == str(tmp_path)
    assert got["torch"]  # preloaded by the server, not imported by the worker
    assert "-m spawn_entries 7 --uid 3" in got["title"]  # ps / pgrep -f find it as before
    assert err.read_text() == "to stderr\n"


def _running_then_killed(w: spawn.Worker) -> None:
    """``w`` (``wait_forever``) says it is ready, runs (poll None, a short wait times out);
    SIGKILLed, an ExitWaiter wakes on its sentinel, not at the timeout, and its code is -9."""
    assert w.receive(timeout=30) == "ready"
    assert w.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        w.wait(timeout=0.05)
    waiter = ExitWaiter()
    t0 = time.monotonic()
    w.send_signal(signal.SIGKILL)
    waiter.wait([w], timeout=20)
    assert time.monotonic() - t0 < 10
    assert w.wait(timeout=10) == -signal.SIGKILL and w.poll() == -signal.SIGKILL


@pytest.mark.timeout(60)
def test_signals_exceptions_and_the_sentinel_behave_like_popen(entries, tmp_path):
    w = spawn.start("spawn_entries:wait_forever", [], stderr_path=str(tmp_path / "e1"),
                    channel=True)
    _running_then_killed(w)
    w.kill()  # a no-op once it has ended, as Popen.kill
    bad = spawn.start("spawn_entries:fail", [], stderr_path=str(tmp_path / "e2"))
    assert bad.wait(timeout=30) == 1
    assert "ValueError: boom" in (tmp_path / "e2").read_text()


@pytest.mark.timeout(120)
def test_a_script_without_a_main_guard_can_start_workers(entries, tmp_path):
    # multiprocessing's forkserver would re-run this script in every child; ours does not
    script = tmp_path / "noguard.py"
    script.write_text(textwrap.dedent('''
        from unbroken import spawn
        w = spawn.start("spawn_entries:report", ["0"], stderr_path="/dev/null", channel=True)
        w.receive(timeout=60)
        print("rc", w.wait(timeout=60))
    '''))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=110, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert p.returncode == 0 and p.stdout.strip() == "rc 0", p.stderr[-2000:]


@pytest.mark.timeout(120)
def test_workers_still_starting_leave_with_their_launcher(entries, tmp_path):
    # a launcher SIGKILLed while its worker waits: the server sees its socket close and exits,
    # and the worker, still holding PR_SET_PDEATHSIG on the server, follows
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent('''
        from unbroken import spawn
        w = spawn.start("spawn_entries:wait_forever", [], stderr_path="/dev/null",
                        channel=True)
        w.receive(timeout=60)
        print(w.pid, flush=True)
        input()
    '''))
    p = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    try:
        pid = int(p.stdout.readline())
        fd = os.pidfd_open(pid)  # readable when it ends (it is not our child to wait on)
        p.kill()
        p.wait(timeout=10)
        assert select.select([fd], [], [], 10)[0], "the worker outlived its launcher"
        os.close(fd)
    finally:
        p.kill()


@pytest.mark.timeout(60)
def test_an_exit_status_read_by_two_threads_stays_the_real_one(entries, tmp_path):
    # the supervisor's loop polls a hung member while a dump thread kills it: both may see the
    # sentinel readable before either has read the status; the second read found EOF and
    # turned the exit into 255 ("unknown"). A reader that comes second is what _collect's
    # second call is here.
    w = spawn.start("spawn_entries:report", ["7"], stderr_path=str(tmp_path / "e"),
                    channel=True)
    w.receive(timeout=30)
    select.select([w.sentinel], [], [], 30)
    w._collect()
    w._collect()
    assert w.returncode == 7 and w.poll() == 7 and w.wait(timeout=1) == 7


@pytest.mark.timeout(60)
def test_a_launcher_holding_more_than_1024_descriptors_still_waits_on_its_workers(entries,
                                                                                  tmp_path):
    """A test process that had run many jobs held descriptors past 1024, and every wait on a
    worker raised ``select``'s "filedescriptor out of range" instead of waiting (a supervisor
    of many groups gets there too). The waits poll: no limit on the number."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard descriptor limit {hard} is under 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while len(held) < 1030:  # what is left free is numbered past 1024
            held.append(os.open(os.devnull, os.O_RDONLY))
        w = spawn.start("spawn_entries:wait_forever", [], stderr_path=str(tmp_path / "e"),
                        channel=True)
        assert w.sentinel >= 1024 and w._channel >= 1024
        with pytest.raises(ValueError):  # what the waits did before
            select.select([w.sentinel], [], [], 0)
        _running_then_killed(w)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.timeout(60)
def test_a_worker_keeps_freed_memory_instead_of_faulting_it_in_every_step(entries, tmp_path):
    # the control: a fresh interpreter with glibc's dynamic thresholds trims the heap after each
    # round and faults its 8 MiB (2,048 pages) in again; steady_malloc keeps it
    def fresh(steady: bool) -> float:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("MALLOC_") and k != "UNBROKEN_STEADY_MALLOC"}
        out = subprocess.run(
            [sys.executable, "-c", f"import spawn_entries as e; print(e.faults_per_round({steady}))"],
            env=env, capture_output=True, text=True, timeout=30, check=True)
        return float(out.stdout)

    assert fresh(False) > 1000
    assert fresh(True) < 50
    w = spawn.start("spawn_entries:churn", [], stderr_path=str(tmp_path / "err"), channel=True)
    assert w.receive(timeout=30) < 50  # forked from the server: steady without asking
    assert w.wait(timeout=30) == 0
