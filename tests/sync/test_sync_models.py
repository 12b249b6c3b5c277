"""The sync face's learned parts: journal reader, predictor vs last-value, ML selector, files."""

import json

import numpy as np
import pytest

from unbroken.runtime import modelfile
from unbroken.sync.cli import load_predictor, load_selector
from unbroken.sync.journal import read_journal_dir, to_array
from unbroken.sync.predictor import HORIZON, WINDOW, evaluate, last_value, train_predictor
from unbroken.sync.selector import compare, train_selector
from unbroken.sync.synthetic import synthetic_run, synthetic_runs


def test_journal_reader_takes_commit_lines(tmp_path):
    lines = [{"event": "restore", "step": 0, "t": 9.0},
             {"event": "commit", "step": 0, "t": 10.0, "compute_s": 0.4},
             {"event": "commit", "step": 1, "t": 10.5, "cpu_avail": 0.9, "tx_bytes": 100},
             {"event": "commit", "step": 2, "step_s": 0.7, "t": 11.2, "rx_bytes": 5}]
    (tmp_path / "group-0.jsonl").write_text(
        "\n".join(json.dumps(x) for x in lines) + '\n{"event": "comm')  # torn last line
    (tmp_path / "group-1.jsonl").write_text(json.dumps({**lines[2], "step_s": 0.6}) + "\n")
    run = read_journal_dir(str(tmp_path))
    assert [r["step"] for r in run[0]] == [0, 1, 2]
    assert run[0][0]["step_s"] == 0.4 and run[0][1]["step_s"] == pytest.approx(0.5)
    assert run[0][1]["cpu_avail"] == 0.9 and run[0][0]["rx_bytes"] == 0.0
    assert to_array(run).shape == (2, 1, 4)     # aligned on the step both groups have
    with pytest.raises(ValueError, match="no group-U.jsonl"):
        read_journal_dir(str(tmp_path / ".."))


def test_lstm_beats_last_value_on_bursty_traces():
    train = [to_array(r) for r in synthetic_runs(3, seed=1, groups=4, steps=300,
                                                 kinds=("bursty",))]
    test = [to_array(r) for r in synthetic_runs(2, seed=2, groups=4, steps=300,
                                                kinds=("bursty",))]
    p = train_predictor(train, seed=0, epochs=6, stride=3)
    assert p.predict(test[0][:, :WINDOW]).shape == (4, HORIZON)
    lstm, last = evaluate(p.predict, test), evaluate(last_value, test)
    assert lstm["mae_s"] < 0.9 * last["mae_s"]
    assert lstm["precision"] is not None and last["recall"] is not None


def test_predictor_file_round_trip_and_refusals(tmp_path):
    runs = [to_array(synthetic_run("persistent", groups=3, steps=80, seed=0))]
    p = train_predictor(runs, epochs=1)
    f = tmp_path / "m" / "pred.bin"
    modelfile.save(str(f), "predictor", p.state, p.meta)
    assert not [x for x in f.parent.iterdir() if x.name.startswith(".tmp")]
    q = load_predictor(str(f))
    win = runs[0][:, :WINDOW]
    assert np.allclose(q.predict(win), p.predict(win))
    raw = f.read_bytes()
    (tmp_path / "flip.bin").write_bytes(raw[:-10] + bytes([raw[-10] ^ 1]) + raw[-9:])
    (tmp_path / "junk.bin").write_bytes(b"hello")
    for name, word in (("flip.bin", "checksum mismatch"), ("junk.bin", "not an unbroken"),
                       ("none.bin", "unreadable")):
        with pytest.raises(modelfile.ModelFileError, match=word) as e:
            load_predictor(str(tmp_path / name))
        assert name in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(modelfile.ModelFileError, match="not a selector"):
        load_selector(str(f))


@pytest.mark.slow
def test_ml_selector_agrees_with_the_heuristic_on_held_out_profiles():
    sel = train_selector(groups=6, n=250, seed=0, epochs=250)
    res = compare(sel, n=50, seed=1)
    assert res["agreement"] >= 0.75
    assert res["regret_mean"] < 0.05
    mode, reason = sel.choose([1.0] * 6, 48.0)
    assert mode == "sync" and reason.startswith("sync")


def test_a_runtime_selector_learns_the_runtime_auto_and_only_picks_its_modes(tmp_path):
    from unbroken.core.sync import AUTO_MODES, AutoState, CostModel, decide

    sel = train_selector(groups=4, n=250, seed=0, epochs=250, runtime=True)
    assert sel.meta["for"] == "runtime" and sel.meta["allowed"] == list(AUTO_MODES)
    assert set(sel.meta["label_counts"]) <= {"sync", "mask", "ksync:1", "ksync:2", "ksync:3"}
    res = compare(sel, n=50, seed=1)
    assert res["agreement"] >= 0.75, res
    # restricted to the allowed modes whatever the network's first choice
    for t in ([1.0, 2.0, 1.0, 1.0], [1.0, 1.5, 3.0, 1.0], [3.0, 3.0, 1.0, 1.0]):
        assert sel.choose(t, 32.0, ("sync", "mask"))[0] in ("sync", "mask")
    # decide() with it as the chooser: the heuristic's hysteresis, the network's pick
    f = tmp_path / "sel.pt"
    modelfile.save(str(f), "selector", sel.state, sel.meta)
    choose = load_selector(str(f)).chooser()
    cm = CostModel.for_runtime(8, 2, noise_scale=32.0)
    times = [1.0, 2.0, 1.0, 1.0]
    d = decide(AutoState(), times, cm, allowed=AUTO_MODES, greedy_mask=True, choose=choose)
    assert not d.switched and d.mode == "sync"  # 1 of 2 confirming predictions
    d = decide(d.state, times, cm, allowed=AUTO_MODES, greedy_mask=True, choose=choose)
    assert d.mode == sel.choose(times, 32.0, AUTO_MODES)[0]
    assert "ML selector" in d.reason and set(d.selection.tta()) >= {"sync", "mask"}
    back = decide(d.state, [1.0] * 4, cm, allowed=AUTO_MODES, choose=choose)
    back = decide(back.state, [1.0] * 4, cm, allowed=AUTO_MODES, choose=choose)
    assert back.mode == "sync" and back.reason == "sync: no straggler predicted any more"


def test_a_run_refuses_a_selector_labelled_for_other_cores(tmp_path):
    # the network sees the times and the noise scale, not the machine: a selector labelled
    # for a device per group would choose ksync:3 where 4 groups on 2 cores want ksync:2
    from unbroken.supervise.spec import check_selector

    paths = {}
    for cores in (0, 2):
        sel = train_selector(groups=4, n=20, seed=0, epochs=5, runtime=True, cores=cores)
        paths[cores] = str(tmp_path / f"sel{cores}.pt")
        modelfile.save(paths[cores], "selector", sel.state, sel.meta)
    check_selector(paths[2], "auto", 4, 8, 2, cores=2)
    check_selector(paths[0], "auto", 4, 8, 2, cores=0)
    with pytest.raises(ValueError) as e:
        check_selector(paths[0], "auto", 4, 8, 2, cores=2)
    msg = str(e.value)
    assert "labelled for a device per group; this job runs groups sharing 2 CPU cores" in msg
    assert "--cores 2" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="labelled for groups sharing 2 CPU cores; this job "
                                         "runs a device per group"):
        check_selector(paths[2], "auto", 4, 8, 2, cores=0)
