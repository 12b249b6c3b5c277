"""``--stragglers`` (and its file) and ``--target-loss`` on ``unbroken run`` / ``demo`` as a user
types them: bad input is one line naming the value, exit 2, nothing started; ``none`` is today's
run."""

from __future__ import annotations

import pytest


@pytest.mark.mp  # the CLI in a subprocess
@pytest.mark.parametrize("cmd, args, named", [
    ("run", ["--stragglers", "persistent:4@2"], "group 4 is not in 0..3"),
    ("demo", ["--stragglers", "rotating:1.5"], "rotating probability 1.5 is not in [0, 1]"),
    ("run", ["--stragglers", "{csv}"], "line 3: slowdown '0.5' is below 1.0"),
    ("demo", ["--target-loss", "nan"], "--target-loss: expected a finite number, got 'nan'"),
])
def test_bad_straggler_input_is_one_line_exit_2_and_nothing_started(cli, tmp_path, cmd, args,
                                                                     named):
    csv = tmp_path / "trace.csv"
    csv.write_text("step,group,slowdown\n0,1,2.0\n10,1,0.5\n")
    args = [a.replace("{csv}", str(csv)) for a in args]
    trainer = ["--trainer", "mlp"] if cmd == "run" else []
    p = cli(cmd, *trainer, *args, "--out", str(tmp_path / "out"), "--json")
    assert p.returncode == 2, p.stderr
    assert named in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stdout == "" and not (tmp_path / "out").exists()


def test_none_gives_the_config_of_a_run_without_the_flag():
    from unbroken.supervise.spec import JobSpec, train_config

    plain = train_config(JobSpec(trainer="mlp")).to_json()
    assert train_config(JobSpec(trainer="mlp", stragglers="none")).to_json() == plain
    assert "stragglers" not in plain  # byte for byte the config (and reference key) of today
    slow = train_config(JobSpec(trainer="mlp", stragglers="persistent:1@2"))
    assert slow.stragglers == "persistent:1@2"


def test_a_trace_file_is_read_and_a_missing_one_named(tmp_path, monkeypatch):
    from unbroken.core.stragglers import StragglerSpecError
    from unbroken.runtime.stragglers import load_trace, normalize_spec, own_slowdowns

    csv = tmp_path / "trace.csv"
    csv.write_text("step,group,slowdown\n2,1,3\n")
    assert load_trace(str(csv), 4).matrix(3) == [[1.0] * 4, [1.0] * 4, [1.0, 3.0, 1.0, 1.0]]
    assert own_slowdowns(str(csv), 1, 4, 3, seed=0) == [1.0, 1.0, 3.0]
    assert own_slowdowns(str(csv), 0, 4, 3, seed=0) is None  # never slowed: nothing added
    assert own_slowdowns(None, 1, 4, 3, seed=0) is None
    # the workers get an absolute path (their working directory need not be ours)
    monkeypatch.chdir(tmp_path)
    assert normalize_spec("trace.csv") == str(csv)
    assert normalize_spec(" persistent:1@2 ") == "persistent:1@2"
    for spec, named in [("no-such-trace.csv", "'no-such-trace.csv': no such file"),
                        ("wobbly:3", "unknown pattern 'wobbly:3'")]:
        with pytest.raises(StragglerSpecError, match=named):
            load_trace(spec, 4)
