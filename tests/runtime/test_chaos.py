"""The chaos run, end to end: ``unbroken demo --chaos SEED`` with every fault kind at seeded
steps (kill, hang, slow, nan, bit flip, XID, bad code update) on 4 real worker processes.

Every fault must be detected and answered by the rung meant for it, every sample consumed
exactly once, and the final parameters must equal the failure-free run (every rollback here
restores a verified state and recomputes it, so the trajectory ends where it would have)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from test_demo import demo  # noqa: E402

# fault kind -> how its resolution must read (the rung that answered it)
EXPECTED = {"kill": ("replan", "restart"), "hang": ("replan", "restart"),
            "slow": ("replan", "restart"), "nan": ("retry in place",),
            "update": ("rollback v1 -> v0",), "flip": ("replay named",),
            "xid": ("restart in place", "evict")}


@pytest.mark.timeout(420)
def test_chaos_every_fault_is_handled_by_its_rung_exactly_once(tmp_path):
    rep = demo("--chaos", "0", "--out", str(tmp_path), timeout=400)
    events = [json.loads(x) for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    spec = events[0]["fault_spec"]
    assert sorted(f["kind"] for f in events[0]["faults"]) == sorted(EXPECTED)
    assert rep["exactly_once"] is True and rep["ledger"]["records"] == 200 * 4
    assert rep["max_abs_param_diff"] < 1e-9, spec
    lost = rep["time_lost_per_fault"]
    assert sorted(f["kind"] for f in lost) == sorted(EXPECTED), spec  # every fault fired
    for f in lost:
        assert f["how"].startswith(EXPECTED[f["kind"]]), (f, spec)
        assert f["detect_s"] is not None and f["lost_s"] >= 0
    assert 0 < rep["ettr"] < 1
    rungs = {e["rung"] for e in events if e["event"] == "ladder" and e["mode"] == "act"}
    assert {"retry", "rollback", "replay", "evict"} <= rungs
    # the NaN never reached the parameters: every committed loss is finite
    assert all(e["loss"] == e["loss"] for e in events if e["event"] == "commit")
