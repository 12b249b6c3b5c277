"""The fitted detector file: round trip, checksum, atomic write, refusals on one line, the shipped
default, and the analysis using the file's thresholds as they are."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from unbroken.core.changepoint import ChangePolicy
from unbroken.core.precursors import DetectorPolicy
from unbroken.learn.analyze import Inputs, analyze
from unbroken.learn.detector import (Detector, DetectorFileError, default_detector,
                                     read_detector, write_detector)
from unbroken.learn.rules import _policy_from
from unbroken.learn.sacct import parse_sacct
from unbroken.learn.synth import FAMILIES, sacct_lines


def _det(**kw) -> Detector:
    pol = ChangePolicy(k=1.5, cap=6.0, pair=0.7,
                       thresholds={"power": 20.5, "gpu_temp": 90.0, "interrupts": 30.0})
    return Detector(policy=replace(pol, **kw), signals={"power": {"family": "gpu_load",
                                                                  "floor": 10.0,
                                                                  "sides": "both"}},
                    scrape_s=30.0, fitted_on={"families": ["step"], "reason": "test"},
                    rules=DetectorPolicy(z=4.5, persist=3, families=2))


def test_round_trip_and_atomic_write(tmp_path):
    p = tmp_path / "d.json"
    p.write_text("old")
    digest = write_detector(_det(), p)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["d.json"]     # no temporary left
    d = read_detector(p)
    assert d.policy == _det().policy and d.rules == _det().rules
    assert d.sha256 == digest == json.loads(p.read_text())["sha256"]
    assert write_detector(_det(), tmp_path / "e.json") == digest         # canonical


@pytest.mark.parametrize("edit,words", [
    (lambda d: d["policy"]["thresholds"].update(power=5.0), "checksum mismatch"),
    (lambda d: d.update(format="something"), "not a detector file"),
    (lambda d: d.update(version=7), "version 7"),
])
def test_edited_files_are_refused(tmp_path, edit, words):
    p = tmp_path / "d.json"
    write_detector(_det(), p)
    d = json.loads(p.read_text())
    edit(d)
    p.write_text(json.dumps(d))
    with pytest.raises(DetectorFileError, match=words) as e:
        read_detector(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_bad_values_with_a_good_checksum_are_refused(tmp_path):
    write_detector(_det(thresholds={"power": -1.0}), tmp_path / "d.json")
    with pytest.raises(DetectorFileError, match="threshold power"):
        read_detector(tmp_path / "d.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(DetectorFileError, match="not JSON"):
        read_detector(tmp_path / "x.json")
    with pytest.raises(DetectorFileError, match="nope.json"):
        read_detector(tmp_path / "nope.json")


def test_the_shipped_default_was_fitted_on_every_family():
    d = default_detector()
    assert set(d.fitted_on["families"]) == set(FAMILIES)
    assert d.policy.thresholds and all(h > 0 for h in d.policy.thresholds.values())
    assert "false alarms/day" in d.fitted_on["reason"]


@pytest.mark.slow
def test_analysis_uses_the_files_thresholds_and_rules_read_them(small, tmp_path):
    """The scored cluster does not move the thresholds: they are the file's, whatever the input;
    ``learn rules --from-learn`` takes the file's peer-band rules."""
    det = default_detector()
    jobs, _ = parse_sacct(sacct_lines(small))
    data, ctx = analyze(Inputs(small.frame, [], jobs), detector=det)
    assert data["detector"]["policy"]["thresholds"] == det.policy.thresholds
    assert data["detector"]["sha256"] == det.sha256
    assert set(data["detector"]["signals_used"]) <= set(det.policy.thresholds)
    assert ctx.detection.alert.shape == (len(small.frame.nodes), len(small.frame.t))
    (tmp_path / "L.json").write_text(json.dumps(data, default=float))
    pol, iv, sigs = _policy_from(str(tmp_path / "L.json"))
    assert (pol.z, pol.persist, pol.families) == (det.rules.z, det.rules.persist,
                                                  det.rules.families)
    assert iv == 30.0 and "interrupts" in sigs
