"""The run report's straggler and TTA numbers, read from a synthetic journal (the pure parts
are tested in tests/core/test_stragglers.py)."""

import pytest

from helpers import commit_lines

from unbroken.demo_report import straggler_report


def journal(own: dict[int, list[float]], losses: list[float], t0: float = 100.0,
            step: float = 0.5) -> list[dict]:
    ev = [{"event": "start", "t": t0 - 5, "src": "driver"}]
    for k, loss in enumerate(losses):
        for e in commit_lines(k, t0 + step * k, [0, 1, 2], loss):
            ev.append({**e, "own_s": own[int(e["src"].split("-")[1])][k]})
    return ev


def test_tta_from_the_start_and_from_step_0_and_the_straggler_frequency():
    own = {0: [1.0, 1.0, 1.0, 1.0], 1: [1.1, 3.0, 1.0, 2.0], 2: [1.0, 1.0, 1.0, 1.0]}
    ev = journal(own, [3.0, 2.0, 1.0, 0.5])
    r = straggler_report(ev, t_start=95.0, target_loss=1.0)
    # step 2 (loss 1.0) is first committed at 101.0: 6 s after the start, 1 s after step 0
    assert r["tta_s"] == pytest.approx(6.0) and r["tta_train_s"] == pytest.approx(1.0)
    assert r["straggler_frequency"] == pytest.approx(2 / 4)  # steps 1 and 3
    assert r["sync_modes"] == {"sync": 4} and r["mode_switches"] == 0
    never = straggler_report(ev, t_start=95.0, target_loss=0.1)
    assert never["tta_s"] is None and never["tta_train_s"] is None
    untold = straggler_report(ev, t_start=95.0)
    assert untold["tta_s"] is None and untold["target_loss"] is None
