"""``unbroken sync`` and ``unbroken plan --stragglers`` as a user runs them."""

import json

import pytest


@pytest.mark.mp
def test_plan_stragglers_json_and_bad_specs(cli, tmp_path):
    p = cli("plan", "--stragglers", "persistent:1@3", "--groups", "8", "--step-time", "1s",
            "--allreduce", "0.1s", "--straggler-steps", "90", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert set(d["modes"]) == {"sync", "mask", "ksync", "groups", "async"}
    assert d["auto"]["vs_sync"] < 0.75 and d["straggler_frequency"] == 1.0
    csv = tmp_path / "s.csv"
    csv.write_text("0,1,0.5\n")
    for spec in ("persistent:9@2", str(csv)):
        p = cli("plan", "--stragglers", spec, "--groups", "8")
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "Traceback" not in p.stderr


@pytest.mark.mp
def test_sync_commands_bad_input_is_one_line_exit_2(cli, tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a model")
    cases = [("sync", "eval-predictor", "--model", str(bad), "--synthetic", "1"),
             ("sync", "train-predictor", "--journals", str(tmp_path / "none"), "--out",
              str(tmp_path / "m.bin")),
             ("sync", "train-selector", "--out", "x", "--groups", "-2")]
    for i, args in enumerate(cases):
        p = cli(*args)
        if i == 0:
            assert str(bad) in p.stderr
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
