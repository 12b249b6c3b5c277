"""The learn face at the report's scale: 63 nodes x 3 days at 30 s (8640 scrapes), through the
whole analysis, from OpenMetrics files and from a real Prometheus server.

Phases, each in a fresh process so that its peak memory (max RSS) is its own:

* ``synth``: ``learn synth`` writes the cluster (metrics.om.gz, kern.log, sacct.txt);
* ``file``: ``learn --openmetrics ... --kernel-log ... --sacct ... --json`` in-process (read,
  align, the six analyses with the detector calibrated on the input);
* ``server``: the same from Prometheus over HTTP (the TSDB backfilled with promtool first; the
  backfill's time is reported apart, it is the operator's one-off);
* ``detector``: the change detector alone on the aligned signals (peer z, each unit's own
  baseline, the CUSUM, the combination), against the baseline a user would write — a Python
  loop over scrapes and nodes with numpy percentiles per (scrape, node) — timed on 120 scrapes
  and extrapolated;
* ``fit`` (with ``--fit``): ``learn fit`` at this bench's scale (nodes, GPUs, days; every family,
  one seed each, seeds 1000+), then ``fitted``: the ``file`` phase again with that detector
  instead of the shipped one (fitted on 24-node clusters: false alarms per day grow with the
  number of nodes).

Prints one JSON object. Never asserted in tests.
Usage: python bench/learn.py [--seed S] [--nodes 63] [--days 3] [--no-server] [--fit]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _phase(args: argparse.Namespace) -> dict:
    """One phase, in this process; returns wall and peak memory."""
    sys.path.insert(0, str(SRC))
    d = Path(args.dir)
    t0 = time.perf_counter()
    out: dict = {}
    if args.phase == "synth":
        from unbroken.learn.synth import SynthSpec, generate, write
        s = generate(SynthSpec(seed=args.seed, nodes=args.nodes, days=args.days))
        write(s, d)
        out["samples"] = int(sum((v == v).sum() for v in s.frame.series.values()))
    elif args.phase in ("file", "server", "fitted"):
        from unbroken.learn.analyze import analyze_command
        ns = argparse.Namespace(
            prometheus=args.url if args.phase == "server" else None,
            openmetrics=[str(d / "metrics.om.gz")] if args.phase != "server" else None,
            kernel_log=[str(d / "kern.log")], sacct=str(d / "sacct.txt"), journal=None,
            t_from=None, t_to=None, html=None,
            detector=str(d / "detector.json") if args.phase == "fitted" else None)
        r = analyze_command(ns)
        out.update(detected=r["detected"], failures=len(r["failures"]),
                   before_xid=r["before_xid"], false_alarms_per_day=r["false_alarms_per_day"],
                   scrapes=int(round(r["days"] * 86400 / r["scrape_s"])), nodes=r["nodes"],
                   detector=r["detector"]["reason"])
    elif args.phase == "fit":
        from unbroken.learn.fit import fit_command
        r = fit_command(argparse.Namespace(
            out=str(d / "detector.json"), families="report,step,drift,oscillation,burst,single",
            seeds="1000", nodes=args.nodes, days=args.days, gpus=2, failures=10, early=3,
            silent=2, fp_budget=1.0, margin=0.8))
        out.update(reason=r["reason"], clusters=r["clusters"])
    elif args.phase == "detector":
        out.update(_detector(d))
    out["wall_s"] = time.perf_counter() - t0
    out["peak_mb"] = _peak_mb()
    return out


def _detector(d: Path) -> dict:
    import numpy as np

    from unbroken.core import changepoint as C
    from unbroken.learn.detector import default_detector
    from unbroken.learn.evidence import evidences
    from unbroken.learn.openmetrics import read_openmetrics
    from unbroken.learn.sacct import membership, read_sacct
    from unbroken.learn.signals import build_signals

    frame = read_openmetrics([str(d / "metrics.om.gz")])
    jobs, _ = read_sacct(str(d / "sacct.txt"))
    sig = build_signals(frame)
    live = sig.present & membership(jobs, frame.nodes, frame.t)
    pol = default_detector().policy
    t0 = time.perf_counter()
    ev = evidences(sig, live, pol, [(pol.k, pol.cap)])[(pol.k, pol.cap)]
    t1 = time.perf_counter()
    C.combine(ev, sig.family, pol)
    t2 = time.perf_counter()
    # the baseline: a loop over scrapes and nodes, numpy percentiles of each node's peers
    x = np.where(live, sig.values["interrupts"], np.nan)
    N, T = x.shape
    k = 120
    tb = time.perf_counter()
    for t in range(T // 2, T // 2 + k):
        col = x[:, t]
        for n in range(N):
            peers = np.delete(col, n)
            peers = peers[np.isfinite(peers)]
            if len(peers) >= 3 and np.isfinite(col[n]):
                lo, hi = np.percentile(peers, [5, 95])
                med = np.median(peers)
                mad = np.median(np.abs(peers - med))
                _ = (col[n] < lo or col[n] > hi) and abs(col[n] - med) > 4 * max(mad, 1e-9)
    loop_per_scrape = (time.perf_counter() - tb) / k
    units = sum(v.shape[0] for v in sig.values.values())
    return {"signals": len(sig.values), "units": units, "nodes": N, "scrapes": T,
            "evidence_s": t1 - t0, "combine_s": t2 - t1,
            "loop_baseline_peer_stats_s": loop_per_scrape * T * units / N,
            "speedup_evidence": loop_per_scrape * T * units / N / (t1 - t0)}


def _run_phase(phase: str, args, url: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--phase", phase, "--dir", args.dir, "--seed",
           str(args.seed), "--nodes", str(args.nodes), "--days", str(args.days)]
    if url:
        cmd += ["--url", url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"phase {phase} failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _server(args, res: dict) -> None:
    d = Path(args.dir)
    if not (shutil.which("promtool") and shutil.which("prometheus")):
        res["server"] = {"skipped": "prometheus/promtool not installed"}
        return
    with gzip.open(d / "metrics.om.gz", "rb") as src, open(d / "metrics.om", "wb") as dst:
        shutil.copyfileobj(src, dst)
    t0 = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                    str(d / "metrics.om"), str(d / "tsdb")], check=True, capture_output=True)
    backfill = time.perf_counter() - t0
    (d / "metrics.om").unlink()
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 30s\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["prometheus", f"--config.file={d / 'prometheus.yml'}",
                             f"--storage.tsdb.path={d / 'tsdb'}",
                             "--storage.tsdb.retention.time=100y",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        res["server"] = _run_phase("server", args, url)
        res["server"]["promtool_backfill_s"] = backfill
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase")
    ap.add_argument("--dir")
    ap.add_argument("--url")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=63)
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--fit", action="store_true")
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(_phase(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.dir = tmp
        res = {"nodes": args.nodes, "days": args.days, "scrape_s": 30, "seed": args.seed}
        res["synth"] = _run_phase("synth", args)
        res["metrics_gz_mb"] = os.path.getsize(Path(tmp) / "metrics.om.gz") / 1e6
        res["file"] = _run_phase("file", args)
        res["detector"] = _run_phase("detector", args)
        if args.fit:
            res["fit"] = _run_phase("fit", args)
            res["fitted"] = _run_phase("fitted", args)
        if args.no_server:
            res["server"] = {"skipped": "--no-server"}
        else:
            _server(args, res)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
