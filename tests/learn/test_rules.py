"""``unbroken learn rules``: promtool accepts the rules, and its unit tests show the precursor
alert firing on a collapsing node and staying quiet on healthy ones."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from unbroken.core.precursors import DetectorPolicy
from unbroken.learn.rules import rules_yaml

pytestmark = [pytest.mark.mp, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("promtool") is None,
                                 reason="promtool not installed (Debian package 'prometheus'; "
                                        "make test installs it)")]

POLICY = DetectorPolicy(z=5.0, persist=3, families=2)
SLOPES = [300000, 301000, 299000, 302000, 298000, 300500]
PROCS = [40, 41, 39, 42, 38, 40]


def _series(collapse: bool) -> list[dict]:
    out = []
    for i, (slope, procs) in enumerate(zip(SLOPES, PROCS), 1):
        inst = f"gpu{i:03d}"
        if collapse and i == 1:      # interrupts to ~27 %, runnable processes to 0 at 30 min
            intr = f"0+{slope}x60 {60 * slope + 80000}+80000x40"
            pr = f"{procs}+0x60 0+0x40"
        else:
            intr, pr = f"0+{slope}x100", f"{procs}+0x100"
        out += [{"series": f'node_intr_total{{instance="{inst}"}}', "values": intr},
                {"series": f'node_procs_running{{instance="{inst}"}}', "values": pr}]
    out.append({"series": 'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{instance="gpu003",gpu="0"}',
                "values": "0+0x30 1+0x70" if collapse else "0+0x100"})
    return out


def _precursor(inst: str) -> dict:
    return {"exp_labels": {"severity": "warning", "instance": inst},
            "exp_annotations": {"summary": f"{inst}: 2 metric families outside their peers' "
                                           f"P5-P95 band (|z| > 5, 3 scrapes): a failure "
                                           f"precursor"}}


def _remap() -> dict:
    return {"exp_labels": {"severity": "critical", "instance": "gpu003", "gpu": "0"},
            "exp_annotations": {"summary": "gpu003 GPU 0: uncorrectable remapped rows "
                                           "increased: replace the GPU"}}


def _tests() -> dict:
    fire = {"interval": "30s", "input_series": _series(True), "alert_rule_test": [
        {"eval_time": "29m", "alertname": "UnbrokenFailurePrecursor", "exp_alerts": []},
        {"eval_time": "30m30s", "alertname": "UnbrokenFailurePrecursor", "exp_alerts": []},
        {"eval_time": "33m", "alertname": "UnbrokenFailurePrecursor",
         "exp_alerts": [_precursor("gpu001")]},
        {"eval_time": "45m", "alertname": "UnbrokenFailurePrecursor",
         "exp_alerts": [_precursor("gpu001")]},
        {"eval_time": "14m", "alertname": "GpuUncorrectableRemapIncrease", "exp_alerts": []},
        {"eval_time": "20m", "alertname": "GpuUncorrectableRemapIncrease",
         "exp_alerts": [_remap()]},
    ]}
    quiet = {"interval": "30s", "input_series": _series(False), "alert_rule_test": [
        {"eval_time": t, "alertname": name, "exp_alerts": []}
        for t in ("5m", "20m", "33m", "49m")
        for name in ("UnbrokenFailurePrecursor", "GpuUncorrectableRemapIncrease")]}
    return {"rule_files": ["rules.yml"], "evaluation_interval": "30s", "tests": [fire, quiet]}


def test_promtool_checks_and_unit_tests_the_rules(tmp_path):
    (tmp_path / "rules.yml").write_text(rules_yaml(POLICY, 30.0))
    p = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    # JSON is YAML: the unit-test file needs no YAML library
    (tmp_path / "test.yml").write_text(json.dumps(_tests(), indent=1))
    p = subprocess.run(["promtool", "test", "rules", str(tmp_path / "test.yml")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_broken_detector_fails_the_unit_tests(tmp_path):
    """The unit tests can fail: rules that need three families never fire on a two-family
    collapse."""
    (tmp_path / "rules.yml").write_text(rules_yaml(DetectorPolicy(z=5.0, persist=3,
                                                                  families=3), 30.0))
    (tmp_path / "test.yml").write_text(json.dumps(_tests(), indent=1))
    p = subprocess.run(["promtool", "test", "rules", str(tmp_path / "test.yml")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode != 0


def test_rules_from_a_learn_result(cli, tmp_path):
    (tmp_path / "L.json").write_text(json.dumps({"detector": {
        "z": 4.5, "persist": 6, "families": 2, "min_peers": 3, "scrape_s": 15,
        "signals": {"interrupts": {}, "procs_running": {}}}}))
    p = cli("learn", "rules", "--from-learn", str(tmp_path / "L.json"), "--out",
            str(tmp_path / "r.yml"), timeout=60)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "r.yml").read_text()
    assert "interval: 15s" in text and "> bool 4.5" in text and "[82s]" in text
    assert "unbroken:signal:pageouts" not in text
    q = subprocess.run(["promtool", "check", "rules", str(tmp_path / "r.yml")],
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 0, q.stdout
    (tmp_path / "bad.json").write_text("{}")
    p = cli("learn", "rules", "--from-learn", str(tmp_path / "bad.json"), timeout=60)
    assert p.returncode == 2 and "detector" in p.stderr
