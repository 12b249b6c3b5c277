"""The fitted detector file (``learn fit --out FILE``, ``learn --detector FILE``).

Why a file: the thresholds must come from clusters other than the one scored, so fitting and
scoring are two commands, and what passes between them has to be exactly what was fitted —
hence a checksum (a hand-edited or truncated file is refused, not half-read) and an atomic
write (temporary file, fsync, rename, directory fsync: a crash leaves the old file or the new
one).

Format (JSON, one object; ``version`` 1):

* ``format``: ``"unbroken-detector"``, ``version``: 1, ``kind``: ``"peer-cusum"``;
* ``policy``: ``core.changepoint.ChangePolicy``'s numbers (k, cap, pair, block, history, gate,
  min_peers, rel_floor, merge_gap), with ``thresholds``: signal -> h;
* ``signals``: signal -> {family, floor, sides} as fitted (``learn.signals``);
* ``scrape_s``: the scrape interval the thresholds are per (CUSUM units add up per scrape);
* ``fitted_on``: what the fit saw (families, seeds, nodes, days, GPUs, budget, margin, the
  reason line, the grid's rows) — never the scored cluster;
* ``rules``: the peer-band detector (z, persist, families, ...) fitted on the same clusters,
  for ``learn rules`` (PromQL cannot run a CUSUM);
* ``sha256``: hex SHA-256 of the canonical JSON (sorted keys, no spaces) of all the other
  keys.

A default file, fitted by ``learn fit`` with its defaults, ships with the package
(``learn/detector_default.json``); ``learn`` without ``--detector`` uses it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path

from unbroken.core.changepoint import ChangeError, ChangePolicy
from unbroken.core.precursors import DetectorError, DetectorPolicy
from unbroken.fsio import fsync_dir, write_synced

__all__ = ["Detector", "DetectorFileError", "read_detector", "write_detector",
           "default_detector", "DEFAULT_NAME"]

FORMAT, VERSION, KIND = "unbroken-detector", 1, "peer-cusum"
DEFAULT_NAME = "detector_default.json"


class DetectorFileError(ValueError):
    """The file cannot be used (the message names it and why, on one line)."""


@dataclass
class Detector:
    policy: ChangePolicy
    signals: dict            # signal -> {family, floor, sides}
    scrape_s: float
    fitted_on: dict
    rules: DetectorPolicy
    source: str = ""         # the path it was read from
    sha256: str = ""

    def body(self) -> dict:
        pol = asdict(self.policy)
        return {"format": FORMAT, "version": VERSION, "kind": KIND, "policy": pol,
                "signals": self.signals, "scrape_s": self.scrape_s,
                "fitted_on": self.fitted_on,
                "rules": {**asdict(self.rules), "band": list(self.rules.band)}}


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode("utf-8")).hexdigest()


def write_detector(det: Detector, path: str | os.PathLike) -> str:
    """Write atomically; returns the checksum."""
    path = Path(path)
    body = det.body()
    digest = _digest(body)
    text = json.dumps({**body, "sha256": digest}, indent=1, sort_keys=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_synced(tmp, text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    det.sha256 = digest
    return digest


def _policy(cls, d: dict, what: str, src: str):
    if not isinstance(d, dict):
        raise DetectorFileError(f"--detector {src}: '{what}' is not an object")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise DetectorFileError(f"--detector {src}: unknown {what} keys {unknown}")
    kw = dict(d)
    if "band" in kw:
        kw["band"] = tuple(kw["band"])
    try:
        return cls(**kw).check()
    except (ChangeError, DetectorError, TypeError) as e:
        raise DetectorFileError(f"--detector {src}: {e}") from None


def parse_detector(text: str, src: str) -> Detector:
    try:
        d = json.loads(text)
    except ValueError:
        raise DetectorFileError(f"--detector {src}: not JSON (expected a file written by "
                                f"'unbroken learn fit')") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise DetectorFileError(f"--detector {src}: not a detector file (expected format "
                                f"{FORMAT!r}, written by 'unbroken learn fit')")
    if d.get("version") != VERSION or d.get("kind") != KIND:
        raise DetectorFileError(f"--detector {src}: version {d.get('version')!r} kind "
                                f"{d.get('kind')!r}; this unbroken reads version {VERSION} "
                                f"kind {KIND!r}")
    digest = d.pop("sha256", None)
    if digest != _digest(d):
        raise DetectorFileError(f"--detector {src}: checksum mismatch (the file was edited or "
                                f"truncated; refit with 'unbroken learn fit')")
    pol = _policy(ChangePolicy, d.get("policy"), "policy", src)
    rules = _policy(DetectorPolicy, d.get("rules"), "rules", src)
    sigs = d.get("signals")
    scrape = d.get("scrape_s")
    if not isinstance(sigs, dict) or not isinstance(scrape, (int, float)) or not scrape > 0:
        raise DetectorFileError(f"--detector {src}: bad 'signals' or 'scrape_s'")
    return Detector(policy=pol, signals=sigs, scrape_s=float(scrape),
                    fitted_on=d.get("fitted_on") or {}, rules=rules, source=src,
                    sha256=digest)


def read_detector(path: str | os.PathLike) -> Detector:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise DetectorFileError(f"--detector {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise DetectorFileError(f"--detector {path}: not text") from None
    return parse_detector(text, str(path))


def default_detector() -> Detector:
    """The detector shipped with the package (fitted by ``learn fit``'s defaults)."""
    text = resources.files("unbroken.learn").joinpath(DEFAULT_NAME).read_text("utf-8")
    return parse_detector(text, f"(default) unbroken/learn/{DEFAULT_NAME}")
