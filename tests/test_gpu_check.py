"""bench/gpu_check.sh on a machine without an NVIDIA GPU: one line and exit 0, before anything is
installed (the check itself needs GPUs and is no part of ``make test``); and how
bench/gpu_check.py measures kill -> commit from a run's journals."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = ("gpu_check: no NVIDIA GPU here (nvidia-smi missing, failing or listing none): "
          "nothing checked\n")


@pytest.mark.mp
@pytest.mark.parametrize("smi", [None, 'echo "NVIDIA-SMI has failed because it could not '
                                       'communicate with the NVIDIA driver."; exit 9',
                                 'echo "No devices were found"; exit 6'],
                         ids=["no-nvidia-smi", "no-driver", "no-devices"])
def test_no_gpu_is_one_line_and_exit_0_with_nothing_installed(tmp_path, smi):
    (tmp_path / "bench").mkdir()
    script = tmp_path / "bench" / "gpu_check.sh"
    shutil.copy(ROOT / "bench" / "gpu_check.sh", script)
    bindir = tmp_path / "bin"  # the whole PATH: a machine without (working) NVIDIA tools
    bindir.mkdir()
    if smi is not None:
        (bindir / "nvidia-smi").write_text(f"#!/bin/sh\n{smi}\n")
        (bindir / "nvidia-smi").chmod(0o755)
    p = subprocess.run([shutil.which("bash"), str(script)], env={"PATH": str(bindir)},
                       capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (0, NO_GPU, "")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bench", "bin"]  # no .venv made


def test_kill_to_commit_is_the_last_live_group_committing_the_step_after_the_fault():
    spec = importlib.util.spec_from_file_location("bench_gpu_check",
                                                  ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    events = [{"event": "start", "t": 0.0},
              {"event": "fault", "kind": "kill", "group": 1, "uid": 1, "step": 10, "t": 5.0}]

    def commits(*pairs):
        return [{"event": "commit", "step": s, "t": t} for s, t in pairs]

    groups = {0: commits((9, 4.9), (10, 5.2), (11, 5.3)),
              1: commits((9, 4.9), (10, 4.99)),      # the victim: never counted
              2: commits((9, 4.95), (10, 5.4)),      # the last live group to commit step 10
              3: []}                                 # a spare still waiting
    assert mod.fault_to_commit(events, groups, "kill") == {
        "step": 10, "victim": 1, "s": pytest.approx(0.4), "groups": [0, 2]}
    assert mod.fault_to_commit(events, groups, "hang") is None
    late = {0: commits((10, 4.8)), 2: commits((10, 4.9))}  # commits before the fault only
    assert mod.fault_to_commit(events, late, "kill") is None
