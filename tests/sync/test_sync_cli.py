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
    # 4 groups sharing 2 cores (what a run on this machine prices by): ksync:2, not ksync:3
    plans = {}
    for extra in ((), ("--cores", "2")):
        p = cli("plan", "--stragglers", "persistent:1@2", "--groups", "4", "--step-time",
                "1s", "--allreduce", "0.2s", "--straggler-steps", "30", "--json", *extra)
        assert p.returncode == 0, p.stderr
        plans[extra[-1] if extra else "device"] = json.loads(p.stdout)
    assert plans["device"]["cores"] == 0 and plans["2"]["cores"] == 2
    assert plans["device"]["modes"]["ksync"]["mode"] == "ksync:3"
    assert plans["2"]["modes"]["ksync"]["mode"] == "ksync:2"
    # the all-reduce is not stretched: sync's step is 0.2 + 2 x (2 x 1 s) on 2 cores
    assert plans["2"]["modes"]["sync"]["gap_s"] == pytest.approx(4.2)
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
             ("sync", "train-selector", "--out", "x", "--groups", "-2"),
             ("sync", "train-selector", "--out", str(tmp_path / "s.pt"), "--shard-batch",
              "16"),
             ("sync", "train-selector", "--out", str(tmp_path / "s.pt"), "--cores", "2"),
             ("sync", "train-selector", "--out", str(tmp_path / "s.pt"), "--runtime",
              "--cores", "0")]
    for i, args in enumerate(cases):
        p = cli(*args)
        if i == 0:
            assert str(bad) in p.stderr
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


@pytest.mark.mp
@pytest.mark.timeout(180)
def test_a_runtime_selector_trained_from_the_cli_chooses_auto_s_mode_in_a_run(cli, tmp_path):
    import os

    from unbroken.core.sync import shared_cores

    # labelled for this machine: the run's 4 groups share its cores when they outnumber them
    cores = shared_cores(4, len(os.sched_getaffinity(0)))
    model = tmp_path / "sel.pt"
    p = cli("sync", "train-selector", "--runtime", "--groups", "4", "--examples", "300",
            "--held-out", "20", "--out", str(model), "--json",
            *(["--cores", str(cores)] if cores else []))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["for"] == "runtime" and d["groups"] == 4 and d["held_out"]["profiles"] == 20
    out = tmp_path / "run"
    p = cli("run", "--trainer", "gpt", "--trainer-args", '{"n_layer": 1, "d_model": 32}',
            "--steps", "40", "--faults", "none", "--sync", "auto", "--selector", str(model),
            "--stragglers", "persistent:1@4", "--out", str(out), "--json", timeout=150)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["exactly_once"] and r["steps"] == 40
    events = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    switches = [e for e in events if e["event"] == "mode_switch"]
    assert switches and all("ML selector" in e["reason"] for e in switches
                            if e["to"] != "sync"), switches
    # the workers read the copy kept in the run directory (every node mounts --out)
    import hashlib

    start = next(e for e in events if e["event"] == "start")["config"]
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert start["selector_sha256"] == digest
    assert hashlib.sha256((out / "selector.pt").read_bytes()).hexdigest() == digest
