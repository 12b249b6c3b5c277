"""``unbroken learn`` as a user runs it: synth, the analysis with --json, plan --from, and bad
input (one line, exit 2, no traceback; or a warning and the rest analysed)."""

from __future__ import annotations

import gzip
import json

import pytest

pytestmark = [pytest.mark.mp, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    import subprocess
    import sys
    from pathlib import Path
    ROOT = Path(__file__).resolve().parents[2]

    d = tmp_path_factory.mktemp("synth")
    p = subprocess.run([sys.executable, "-m", "unbroken", "learn", "synth", "--seed", "7",
                        "--out", str(d), "--nodes", "10", "--days", "2", "--failures", "3",
                        "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["failures"] == 3
    return d


def _learn(cli, d, *extra):
    return cli("learn", "--openmetrics", str(d / "metrics.om.gz"), "--kernel-log",
               str(d / "kern.log"), "--sacct", str(d / "sacct.txt"), *extra, timeout=240)


def test_json_has_the_issues_keys_and_matches_the_truth(cli, synth_dir):
    p = _learn(cli, synth_dir, "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for k in ("failures", "detected", "before_xid", "false_alarms_per_day",
              "exclusion_top3_share", "retry_chains", "checkpoint_phases", "mtbf_s",
              "restart_s", "ckpt_save_s"):
        assert k in d
    truth = json.loads((synth_dir / "truth.json").read_text())
    assert sorted(f["node"] for f in d["failures"]) == sorted(f["node"] for f in
                                                              truth["failures"])
    assert d["detected"] == 3
    for f in d["failures"]:
        assert {"node", "xid_time", "detected_time", "lead_s"} <= set(f)
        assert f["lead_s"] == pytest.approx(f["xid_time"] - f["detected_time"])


def test_terminal_summary(cli, synth_dir):
    p = _learn(cli, synth_dir)
    assert p.returncode == 0, p.stderr
    for words in ("1. Precursors", "3/3 failures detected", "Checkpoint I/O", "Retry chains",
                  "For the planner"):
        assert words in p.stdout


def test_plan_from_learn_uses_the_measured_numbers(cli, synth_dir, tmp_path):
    p = _learn(cli, synth_dir, "--json")
    learn = json.loads(p.stdout)
    (tmp_path / "LEARN.json").write_text(p.stdout)
    q = cli("plan", "--from", str(tmp_path / "LEARN.json"), "--gpus", "1024", "--groups", "16",
            "--seeds", "1", "--steps", "100", "--r-max", "2", "--jobs", "1", "--json",
            "--png", str(tmp_path / "plan.png"), timeout=240)
    assert q.returncode == 0, q.stderr
    plan = json.loads(q.stdout)
    sc = plan["scenario"]
    assert sc["t_restart"] == pytest.approx(learn["restart_s"])
    assert sc["t_save"] == pytest.approx(learn["ckpt_save_s"])
    assert sc["mtbf"] == pytest.approx(learn["planner"]["gpu_mtbf_s"] / 1024)
    q = cli("plan", "--from", str(tmp_path / "LEARN.json"), "--restart", "7m", "--gpus", "1024",
            "--groups", "16", "--seeds", "1", "--steps", "100", "--r-max", "2", "--jobs", "1",
            "--json", "--png", str(tmp_path / "plan.png"), timeout=240)
    assert json.loads(q.stdout)["scenario"]["t_restart"] == 420     # the flag wins


def _one_line_exit_2(p, *words):
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), p.stderr


def test_bad_input_exits_2_with_one_line(cli, synth_dir, tmp_path):
    _one_line_exit_2(cli("learn", "--openmetrics", str(tmp_path / "nope.om")), "nope.om")
    _one_line_exit_2(_learn(cli, synth_dir, "--from", "2026-11-02", "--to", "2026-11-01"),
                     "empty time range")
    _one_line_exit_2(_learn(cli, synth_dir, "--from", "2030-01-01"), "empty time range")
    _one_line_exit_2(_learn(cli, synth_dir, "--detector", "z=4,k=3"), "--detector")
    _one_line_exit_2(cli("learn", "--prometheus", "http://127.0.0.1:9", "--json"),
                     "127.0.0.1:9")
    (tmp_path / "x.json").write_text("{}")
    _one_line_exit_2(cli("plan", "--from", str(tmp_path / "x.json")), "planner")
    _one_line_exit_2(cli("learn", "synth", "--out", str(tmp_path), "--nodes", "3"), "--nodes")
    _one_line_exit_2(cli("learn", "synth", "--out", str(tmp_path), "--shapes", "zigzag"),
                     "--shapes zigzag")
    _one_line_exit_2(cli("learn", "fit", "--out", str(tmp_path / "d.json"), "--seeds", "9-3"),
                     "--seeds")
    _one_line_exit_2(cli("learn", "fit", "--out", str(tmp_path / "d.json"), "--families",
                         "step,zigzag"), "--families")


def test_synth_days_too_short_says_how_many_are_enough(cli, tmp_path):
    """The issue's case: --nodes 32 --days 2. One line naming --days, the bound it gives is
    above 2 and is enough."""
    p = cli("learn", "synth", "--out", str(tmp_path / "a"), "--nodes", "32", "--days", "2",
            timeout=120)
    _one_line_exit_2(p, "--days 2:", "too short", "need at least")
    need = float(p.stderr.split("need at least ")[1].split()[0])
    assert need > 2.0
    q = cli("learn", "synth", "--out", str(tmp_path / "b"), "--nodes", "32", "--days",
            str(need), "--gpus", "1", "--json", timeout=240)
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)["failures"] == 10


def test_fit_then_score_with_the_file(cli, synth_dir, tmp_path):
    """learn fit writes a checksummed file from other clusters; learn --detector FILE scores
    with exactly its thresholds; an edited file is refused on one line."""
    out = tmp_path / "det.json"
    p = cli("learn", "fit", "--out", str(out), "--families", "step,burst", "--seeds", "3000",
            "--nodes", "8", "--gpus", "2", "--failures", "3", "--early", "1", "--silent", "1",
            "--json", timeout=240)
    assert p.returncode == 0, p.stderr
    fitted = json.loads(p.stdout)
    saved = json.loads(out.read_text())
    assert saved["sha256"] == fitted["sha256"]
    assert [c[0] for c in saved["fitted_on"]["clusters"]] == ["step", "burst"]
    q = _learn(cli, synth_dir, "--detector", str(out), "--json")
    assert q.returncode == 0, q.stderr
    d = json.loads(q.stdout)
    assert d["detector"]["sha256"] == fitted["sha256"]
    assert d["detector"]["policy"]["thresholds"] == saved["policy"]["thresholds"]
    saved["policy"]["k"] = 0.5
    (tmp_path / "edited.json").write_text(json.dumps(saved))
    _one_line_exit_2(_learn(cli, synth_dir, "--detector", str(tmp_path / "edited.json")),
                     "edited.json", "checksum mismatch")


def test_malformed_lines_warn_with_line_numbers_and_the_rest_is_read(cli, synth_dir,
                                                                    tmp_path):
    with gzip.open(synth_dir / "metrics.om.gz", "rt") as fh:
        lines = fh.readlines()
    lines.insert(5, "node_procs_running{instance=\"gpu001\"} 12\n")           # no timestamp
    lines.insert(9, "node_intr_total{instance=\"gpu002\" 12 1793491260\n")     # torn labels
    (tmp_path / "m.om").write_text("".join(lines))
    sacct = (synth_dir / "sacct.txt").read_text().splitlines()
    sacct.insert(3, "123|broken|row")
    (tmp_path / "sacct.txt").write_text("\n".join(sacct) + "\n")
    p = cli("learn", "--openmetrics", str(tmp_path / "m.om"), "--kernel-log",
            str(synth_dir / "kern.log"), "--sacct", str(tmp_path / "sacct.txt"), "--json",
            timeout=240)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    w = "\n".join(d["warnings"])
    assert "m.om:6:" in w and "m.om:10:" in w and "sacct.txt:4:" in w
    assert d["detected"] == 3


def test_fewer_than_three_peers_is_a_warning(cli, tmp_path):
    q = cli("learn", "synth", "--seed", "1", "--out", str(tmp_path), "--nodes", "4", "--days",
            "2", "--failures", "1", timeout=120)
    assert q.returncode == 0, q.stderr
    with gzip.open(tmp_path / "metrics.om.gz", "rt") as fh:
        keep = [ln for ln in fh if "gpu004" not in ln]
    (tmp_path / "three.om").write_text("".join(keep))
    p = cli("learn", "--openmetrics", str(tmp_path / "three.om"), "--json", timeout=120)
    assert p.returncode == 0, p.stderr
    assert any("3 live peers" in w for w in json.loads(p.stdout)["warnings"])
