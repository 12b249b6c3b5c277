"""The synthetic cluster: deterministic, and its files say what its truth says."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from unbroken.core.xid import scan
from unbroken.learn.openmetrics import read_openmetrics
from unbroken.learn.sacct import parse_sacct
from unbroken.learn.synth import SynthSpec, generate, sacct_lines, write


def test_same_seed_same_data_other_seed_other_data():
    spec = SynthSpec(seed=3, nodes=8, days=2.0, failures=2, before=1)
    a, b = generate(spec), generate(spec)
    c = generate(SynthSpec(seed=4, nodes=8, days=2.0, failures=2, before=1))
    assert a.truth == b.truth
    for k in a.frame.series:
        np.testing.assert_array_equal(a.frame.series[k], b.frame.series[k])
    assert a.truth["failures"] != c.truth["failures"]


def test_truth_shapes(small):
    t = small.truth
    assert len(t["failures"]) == 3
    leads = [f["precursor_lead_s"] for f in t["failures"]]
    assert sum(x > 300 for x in leads) == 1            # `before` failures start minutes early
    for f in t["failures"]:
        assert t["start"] <= f["xid_time"] <= t["end"]
    saves = [p for p in t["checkpoint_phases"] if p["kind"] == "save"]
    loads = [p for p in t["checkpoint_phases"] if p["kind"] == "load"]
    assert saves and loads
    # every retry interval near the report's 11 min (10-11 IQR)
    iv = [x for c in t["retry_chains"] for x in c["intervals_s"]]
    assert 600 <= np.median(iv) <= 720


@pytest.mark.slow
def test_files_round_trip(small, tmp_path):
    paths = write(small, tmp_path)
    with gzip.open(paths["metrics"], "rt") as fh:
        text = fh.read()
    assert text.rstrip().endswith("# EOF")
    frame = read_openmetrics([paths["metrics"]])
    assert frame.nodes == small.frame.nodes
    np.testing.assert_allclose(frame.t, small.frame.t)
    for k, v in small.frame.series.items():
        np.testing.assert_allclose(frame.series[k], v, rtol=1e-5, equal_nan=True)
    events, bad = scan(open(paths["kernel_log"]))
    assert not bad
    assert sorted(e.code for e in events) == sorted(f["xid"] for f in small.truth["failures"])
    jobs, warnings = parse_sacct(open(paths["sacct"]).readlines())
    assert not warnings
    assert len(jobs) == len(sacct_lines(small)) - 1
    truth = json.loads(open(paths["truth"]).read())
    assert truth["failures"][0]["node"] == small.truth["failures"][0]["node"]
