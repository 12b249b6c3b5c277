"""``--sync`` on ``unbroken run`` / ``demo`` as a user types it: an unknown mode (``groups:3``
included: groups and async take no argument), K out of range, or a mode that needs redundancy
it lacks is one line naming the value, exit 2, nothing started; ``sync`` is today's run byte
for byte."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.mp  # the CLI in a subprocess
@pytest.mark.parametrize("cmd, args, named", [
    ("run", ["--sync", "fast"], "unknown sync mode 'fast'"),
    ("demo", ["--sync", "groups:3"], "unknown sync mode 'groups:3'"),
    ("run", ["--sync", "auto", "--selector", "/nonexistent/sel.pt"],
     "model file '/nonexistent/sel.pt': unreadable"),
    ("run", ["--selector", "sel.pt"], "--selector sel.pt: chooses auto's mode; it needs --sync "
                                      "auto (got --sync sync)"),
])
@pytest.mark.timeout(60)
def test_bad_sync_mode_is_one_line_exit_2_and_nothing_started(cli, tmp_path, cmd, args, named):
    trainer = ["--trainer", "mlp"] if cmd == "run" else []
    p = cli(cmd, *trainer, *args, "--out", str(tmp_path / "out"), "--json")
    assert p.returncode == 2, p.stderr
    assert named in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stdout == "" and not (tmp_path / "out").exists()


def test_sync_gives_the_config_of_a_run_without_the_flag_and_mask_reaches_the_workers():
    from unbroken.runtime.config import TrainConfig
    from unbroken.supervise.spec import JobSpec, train_config

    plain = train_config(JobSpec(trainer="mlp")).to_json()
    assert train_config(JobSpec(trainer="mlp", sync="sync")).to_json() == plain
    assert "sync" not in plain  # the reference cache's key is today's
    cfg = train_config(JobSpec(trainer="mlp", sync="auto"))
    assert TrainConfig.from_json(cfg.to_json()).sync == "auto"


@pytest.mark.parametrize("text, groups, r, named", [
    ("ksync:5", 4, 2, "K 5 outside [1, 4]"),
    ("ksync:x", 4, 2, "K 'x' is not an integer"),
    ("groups:3", 4, 2, "unknown sync mode 'groups:3'"),
    ("async:2", 4, 2, "unknown sync mode 'async:2'"),
    ("auto", 4, 1, "--sync auto: leaving a group out needs --redundancy >= 2"),
])
def test_check_sync_names_the_bad_value(text, groups, r, named):
    from unbroken.supervise.spec import check_sync

    with pytest.raises(ValueError, match=named.replace("[", r"\[")):
        check_sync(text, groups, r)
    for ok in ("sync", "mask", "auto", "ksync:3", "ksync:1", "groups", "async"):
        check_sync(ok, 4, 2)


def test_check_selector_refuses_a_file_that_is_no_runtime_selector_for_this_job(tmp_path):
    from unbroken.supervise.spec import JobSpec, check_selector, train_config
    from unbroken.runtime import modelfile
    from unbroken.sync.selector import train_selector

    def save(name: str, **kw) -> str:
        sel = train_selector(n=20, seed=0, epochs=2, **kw)
        modelfile.save(str(tmp_path / name), "selector", sel.state, sel.meta)
        return str(tmp_path / name)

    f = save("sel6.pt", groups=6, runtime=True)
    check_selector(f, "auto", 6, 8, 2)
    for groups, batch, r in ((4, 8, 2), (6, 16, 2), (6, 8, 3)):
        with pytest.raises(ValueError, match=r"trained for 6 groups, shard batch 8, redundancy "
                                             rf"2; the job has {groups}, {batch}, {r} "):
            check_selector(f, "auto", groups, batch, r)
    with pytest.raises(ValueError, match="a planner's selector .* --runtime --groups 6"):
        check_selector(save("star.pt", groups=6), "auto", 6, 8, 2)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="bad.pt.*not an unbroken sync model"):
        check_selector(str(bad), "auto", 6, 8, 2)
    # the workers get the file's absolute path; no selector, no key (today's config)
    cfg = train_config(JobSpec(trainer="mlp", groups=6, sync="auto", selector=f))
    assert cfg.selector == str(Path(f).resolve())
    assert "selector" not in train_config(JobSpec(trainer="mlp", sync="auto")).to_json()


def test_sync_builds_the_plain_runner_and_the_others_the_mode_runner():
    from unbroken.runtime.config import TrainConfig
    from unbroken.runtime.stacked import StackedRunner
    from unbroken.runtime.syncmodes import ModeRunner, make_runner

    class Comm:  # what the constructors touch
        members, rank, generation, store_lost = [0, 1, 2, 3], 0, 0, False

    assert type(make_runner(TrainConfig(), 0, Comm())) is StackedRunner
    assert type(make_runner(TrainConfig(sync="mask"), 0, Comm())) is ModeRunner
    assert type(make_runner(TrainConfig(sync="async"), 0, Comm())) is ModeRunner


def test_the_ledger_counts_a_caught_up_shard_at_its_data_step():
    from unbroken.core.shards import exactly_once
    from unbroken.core.ledger import DivergenceError, ledger_records

    def commit(k, plan, t, **kw):
        return {"event": "commit", "step": k, "plan": plan, "mine": [], "t": t, **kw}

    # 2 groups, 2 steps: step 0 defers type 1, step 1 catches it up on group 0
    j = {0: [commit(0, {"0": 0}, 1.0, deferred=[1], catch_up=[]),
             commit(1, {"0": 0, "1": 1}, 2.0, deferred=[], catch_up=[[0, 1, 0]])],
         1: [commit(0, {"0": 0}, 1.1, deferred=[1], catch_up=[]),
             commit(1, {"0": 0, "1": 1}, 2.1, deferred=[], catch_up=[[0, 1, 0]])]}
    recs = ledger_records(j)
    assert sorted(recs) == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 1)]
    assert exactly_once(recs, 2, 2).ok
    # without the catch-up the deferred shard is missing; members disagreeing is divergence
    j0 = {0: [commit(0, {"0": 0}, 1.0), commit(1, {"0": 0, "1": 1}, 2.0)]}
    assert not exactly_once(ledger_records(j0), 2, 2).ok
    j[1][1] = commit(1, {"0": 0, "1": 1}, 2.1, catch_up=[[0, 1, 1]])
    with pytest.raises(DivergenceError, match="different catch-ups"):
        ledger_records(j)
