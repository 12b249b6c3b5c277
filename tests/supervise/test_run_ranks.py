"""``unbroken run --ranks-per-group R --shard fsdp|tp`` as a user types it: a sharded job trains
through a rank's kill and a rank's hang under the supervisor, exactly once; a sharding that
cannot work is one line and exit 2 with nothing started."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.mp  # `unbroken run` in a subprocess


@pytest.mark.parametrize("args, named", [
    (["--trainer", "gpt", "--ranks-per-group", "2", "--shard", "tp"],
     "--shard tp: model GPT has no tensor parallel plan"),
    (["--trainer", "mlp", "--ranks-per-group", "3", "--shard", "tp"],
     "hidden width 16 is not divisible by --ranks-per-group 3"),
    (["--trainer", "mlp", "--ranks-per-group", "3", "--shard", "fsdp"],
     "--shard-size 8 is not divisible by --ranks-per-group 3"),
    (["--trainer", "mlp", "--groups", "40", "--ranks-per-group", "4", "--shard", "fsdp"],
     "= 160 worker processes: more than --max-procs 128"),
    (["--trainer", "mlp", "--ranks-per-group", "2"], "--ranks-per-group 2: needs --shard"),
    (["--trainer", "mlp", "--shard", "fsdp"], "--shard fsdp: needs --ranks-per-group"),
    (["--trainer", "mlp", "--ranks-per-group", "2", "--shard", "zero"], "--shard 'zero'"),
    (["--trainer", "mlp", "--ranks-per-group", "0"], "--ranks-per-group 0: must be at least 1"),
    (["--trainer", "mlp", "--device", "tpu"], "--device 'tpu': expected cpu or cuda"),
    (["--trainer", "mlp", "--groups", "40", "--device", "cuda"],
     "41 needed: one per process (40 groups and 1 spares of 1 ranks)"),
])
def test_a_sharding_that_cannot_work_is_one_line_exit_2(cli, tmp_path, args, named):
    p = cli("run", *args, "--steps", "5", "--out", str(tmp_path / "run"))
    assert p.returncode == 2, p.stderr
    assert named in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(240)
def test_a_sharded_job_trains_through_a_killed_and_a_hung_rank(cli, tmp_path):
    out = tmp_path / "run"
    p = cli("run", "--trainer", "mlp", "--groups", "4", "--ranks-per-group", "2",
            "--shard", "fsdp", "--steps", "60", "--faults", "kill:1@10,hang:2@30",
            "--out", str(out), "--json", timeout=230)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads(p.stdout)
    assert rep["exactly_once"] is True
    assert rep["steps"] == 60
    outcomes = {f["kind"]: f["how"] for f in rep["time_lost_per_fault"]}
    assert outcomes["kill"].startswith("replan") and outcomes["hang"].startswith("replan")
    # when the hung rank's sibling fenced the group before the survivors' re-form left it
    # out (a race: either finds the hang), the run's journal says by which rule
    fenced = [e for e in map(json.loads, (out / "journal.jsonl").read_text().splitlines())
              if e["event"] == "group_fenced" and e["src"] == "group-2"]
    assert all(e["sibling"] == 0 and "silent" in e["reason"] for e in fenced), fenced
    # each rank of each group wrote its own journal; rank 0's is the group's
    assert sorted(x.name for x in (out / "groups").glob("rank-*.jsonl"))[:1] == ["rank-0.1.jsonl"]
