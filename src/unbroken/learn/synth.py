"""A synthetic cluster in the formats operators have: ``unbroken learn synth``.

Why: the analyses need a ground truth to be tuned and tested against, and the Backend.AI
report's data (backendai.md) is not reachable. The generator reproduces the report's shapes, not
its numbers: 63 nodes scraped every 30 s, a daily load cycle and AR(1) noise, one training
session with checkpoint saves every 30 min and a load at every (re)start, 10 XID failures whose
nodes carry the report's precursors (interrupt collapse and runnable processes to zero for the
NVLink/bus faults — gpu071; page-out and NFS GETATTR latency spikes for the ECC faults — gpu096;
uncorrectable remap steps before an XID 94 — gpu122), two of them starting minutes *before*
their XID (F1: 2 of 10), node exclusions drawn from a skewed per-node hazard (F3), auto-retry
chains every ~11 min with a third of them succeeding and manual recovery after a give-up (F4),
and checkpoint traffic at the report's rates (F2: ~40 GB/s saves, ~150 GB/s loads, ~93 % of
write latency spent queued in the client). Healthy nodes also have *hiccups*: short bursts on
one to three metric families, the false alarms a detector has to be calibrated against.

Everything comes from one ``numpy.random.Generator`` seeded by ``SynthSpec.seed``; the same
spec gives byte-identical files. ``generate`` returns the data in memory (the tests use it
without touching disk); ``write`` puts DIR/metrics.om.gz, DIR/kern.log, DIR/sacct.txt and the
ground truth DIR/truth.json.

Precursor shapes beyond the report's (``--shapes``: steps, drifts, oscillation, error bursts,
one signal only) and failures without any precursor (``silent``) come from
``learn.synth_shapes``; the GPU metrics (utilisation, temperature, power, SM clock, memory in
use, ECC and PCIe counters) from ``learn.synth_gpu``; the logs from ``learn.synth_logs``.

Synthetic GPUs: ``gpus`` per node (default 2, up to the report's 8) keeps the OpenMetrics file
of 63 nodes x 3 days near 8 M samples; the report's shapes need only one GPU per node.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from unbroken.learn import names as M
from unbroken.learn.frame import Frame
from unbroken.learn.synth_gpu import ar1 as _ar1, gpu_metrics
from unbroken.learn.synth_logs import PCI, kern_lines, sacct_lines, sacct_rows
from unbroken.learn.synth_shapes import FAMILIES, Effects, assign_precursors

__all__ = ["SynthSpec", "Synth", "generate", "write", "FAMILIES_OF_TYPE", "FAMILIES",
           "sacct_lines", "TooShort"]

DAY = 86400.0
#: 2026-11-01T00:00:00Z
DEFAULT_START = 1_793_491_200

# failure type -> (XID codes, detector families its precursor moves)
FAILURE_TYPES = {
    "nvlink": ((145, 149), ("interrupts", "processes")),
    "bus": ((79,), ("interrupts", "processes")),
    "gsp": ((119,), ("processes", "gpu")),
    "ecc": ((94,), ("nfs", "memory")),
    "memory": ((94,), ("nfs", "memory")),
}
FAMILIES_OF_TYPE = {k: v[1] for k, v in FAILURE_TYPES.items()}
_TYPE_MIX = ["nvlink", "nvlink", "nvlink", "bus", "bus", "gsp", "ecc", "ecc", "memory", "memory"]
_HICCUP_FAMILIES = ("interrupts", "processes", "memory", "nfs", "gpu", "net")
_HICCUP_SIZE = {"interrupts": (0.3, 0.6), "processes": (0.1, 0.4), "memory": (4, 15),
                "nfs": (3, 8), "gpu": (0.3, 0.7), "net": (0.3, 0.7)}
LEAD_EARLY_S = 300.0               # a precursor this far ahead of its XID can warn in time


class TooShort(ValueError):
    """--days too short for the failures and their recovery (the message gives the bound)."""


@dataclass(frozen=True)
class SynthSpec:
    seed: int = 0
    nodes: int = 63
    days: float = 3.0
    gpus: int = 2
    dt: float = 30.0
    failures: int = 10
    before: int = 2                    # failures whose precursor starts minutes before the XID
    silent: int = 0                    # failures with no precursor at all
    shapes: str = "report"             # the early precursors' family (learn.synth_shapes)
    other_failures: int = 2            # job failures without an XID (NCCL timeouts)
    hiccups_per_node_day: float = 0.15
    start: int = DEFAULT_START
    ckpt_bytes: float = 9e12           # one checkpoint, all nodes together
    save_Bps: float = 40e9             # report F2: saves ~16 % of 250 GB/s
    load_Bps: float = 150e9            # report F2: loads ~21.5 % of 700 GB/s
    ckpt_every_s: float = 1800.0

    def check(self) -> None:
        if self.nodes < 4:
            raise ValueError(f"--nodes {self.nodes}: need at least 4 (a node and 3 peers)")
        if not 1 <= self.gpus <= len(PCI):
            raise ValueError(f"--gpus {self.gpus}: expected 1..{len(PCI)}")
        if not self.days > 0:
            raise ValueError(f"--days {self.days}: expected a positive number")
        if not 0 <= self.before <= self.failures:
            raise ValueError(f"--early {self.before}: expected 0..--failures ({self.failures})")
        if not 0 <= self.silent <= self.failures - self.before:
            raise ValueError(f"--silent {self.silent}: expected 0..failures - early "
                             f"({self.failures - self.before})")
        if self.shapes not in FAMILIES:
            raise ValueError(f"--shapes {self.shapes}: expected one of {', '.join(FAMILIES)}")
        if self.failures > self.nodes // 2:
            raise ValueError(f"failures {self.failures}: at most nodes/2 ({self.nodes // 2})")


@dataclass
class Synth:
    spec: SynthSpec
    frame: Frame
    kern_lines: list[str]
    sacct_rows: list[dict]
    truth: dict
    healthy: np.ndarray = field(repr=False, default=None)  # (N, T) no precursor, no hiccup


def _overlap(t, dt, a, b):
    """Fraction of each scrape interval (t-dt, t] covered by [a, b)."""
    return np.clip(np.minimum(b, t) - np.maximum(a, t - dt), 0.0, dt) / dt


# -- the history: failures, retry chains, exclusions, checkpoint phases ---------------------

def need_seconds(chains: list[dict]) -> float:
    """The shortest span that holds these failures: the first job starts 10 min in, at least
    an hour of training before each failure and after the last recovery, and every failure's
    notice, retry chain and manual recovery. ``--days`` at or above it always fits."""
    rec = 0.0
    for c in chains:
        used = c["durations"][:-1] if c["success"] else c["durations"]   # success: at a start
        rec += c["notice"] + c["intervals"].sum() + used.sum()
        rec += sum(delay + (0.0 if ok else dur) for delay, dur, ok in c["manual"])
    return 600.0 + (len(chains) + 1) * 3600.0 + rec


def _timeline(spec: SynthSpec, rng: np.random.Generator, node_names: list[str]):
    N = spec.nodes
    t0, t_end = float(spec.start), spec.start + spec.days * DAY
    perm = rng.permutation(N)
    hazard = np.empty(N)
    hazard[perm] = 1.0 / np.arange(1, N + 1) ** 1.6
    hazard /= hazard.sum()

    n_ev = spec.failures + spec.other_failures
    kinds = ["xid"] * spec.failures + ["nccl"] * spec.other_failures
    order = rng.permutation(n_ev)
    kinds = [kinds[i] for i in order]
    types = list(rng.permutation(_TYPE_MIX * (spec.failures // len(_TYPE_MIX) + 1))[:spec.failures])
    # the failures with an early precursor: NVLink/GSP-like ones first (the report's gpu071)
    early_rank = sorted(range(spec.failures), key=lambda i: (types[i] not in ("nvlink", "gsp"), i))
    early = set(early_rank[:spec.before])
    silent = set(early_rank[len(early_rank) - spec.silent:]) if spec.silent else set()
    fail_nodes = list(rng.choice(N, size=spec.failures, replace=False, p=hazard))

    # chains first (their length does not depend on where they are placed), and how long
    # after each failure the job notices it (the NCCL watchdog: 4-10 min after an XID)
    chains = []
    for e in range(n_ev):
        success = rng.random() < 1.0 / 3.0
        n_auto = int(rng.integers(1, 7)) if success else int(rng.integers(5, 9))
        intervals = 600.0 + 60.0 * rng.gamma(2.0, 0.35, size=n_auto)
        durations = rng.uniform(150.0, 420.0, size=n_auto)
        manual = []
        if not success:
            delay = rng.uniform(2400.0, 5400.0)
            for k in range(3):
                ok = k == 2 or rng.random() < 0.3
                manual.append((delay if k == 0 else rng.uniform(1200.0, 1800.0),
                               rng.uniform(150.0, 420.0), ok))
                if ok:
                    break
        notice = float(rng.uniform(240.0, 600.0)) if kinds[e] == "xid" else 20.0
        chains.append(dict(success=success, intervals=intervals, durations=durations,
                           manual=manual, notice=notice))
    first_start = t0 + 600.0
    need = need_seconds(chains)
    free = spec.days * DAY - need
    if free < 0:
        raise TooShort(f"--days {spec.days:g}: too short for {spec.failures} XID failures and "
                       f"{spec.other_failures} NCCL ones with their recovery at --seed "
                       f"{spec.seed} with {N} nodes: need at least "
                       f"{math.ceil(need / DAY * 100) / 100:.2f} days")
    gaps = 3600.0 + rng.dirichlet(np.ones(n_ev + 1)) * free

    attempts, failures, other, exclusions, chain_truth = [], [], [], [], []
    excluded_until = np.full(N, -np.inf)
    down = []  # (node, from, to): not reporting
    t = first_start
    fi = 0
    cur_start, cur_kind = t, "initial"
    for e in range(n_ev):
        x = t + gaps[e] if e else first_start + gaps[0]
        # the attempt that ran until this failure
        members = [n for n in range(N) if excluded_until[n] <= cur_start]
        c = chains[e]
        if kinds[e] == "xid":
            node = int(fail_nodes[fi])
            typ = str(types[fi])
            codes = FAILURE_TYPES[typ][0]
            code = int(codes[int(rng.integers(len(codes)))])
            gpu = int(rng.integers(spec.gpus))
            lead = float(rng.uniform(360.0, 900.0) if fi in early else rng.uniform(-30.0, 15.0))
            role = "early" if fi in early else ("silent" if fi in silent else "late")
            if role == "silent":
                lead = 0.0
            if node not in members:   # the failing node must be in the session
                members.append(node)
                members.sort()
            failures.append(dict(node=node_names[node], node_index=node, gpu=gpu, xid=code,
                                 xid_time=x, type=typ, precursor_onset=x - lead,
                                 precursor_lead_s=lead, role=role,
                                 families=list(FAILURE_TYPES[typ][1])))
            blame = node
            fi += 1
        else:
            other.append(dict(time=x, reason="NCCL watchdog timeout"))
            blame = None
        # the job notices when the collective times out (NCCL watchdog): until then the peers
        # spin in the all-reduce, busy, while the failed node has collapsed
        end = x + c["notice"]
        attempts.append(dict(start=cur_start, end=end, members=members, kind=cur_kind,
                             state="NODE_FAIL" if blame is not None else "FAILED",
                             blame=blame))
        if blame is not None:
            excluded_until[blame] = x + rng.uniform(4 * 3600.0, 8 * 3600.0)
            exclusions.append(dict(node=node_names[blame], time=end, reason="xid"))
            down.append((blame, x + 1200.0, float(excluded_until[blame])))
        # the retry chain
        prev_end = end
        intervals = []
        ok_start = None
        for k in range(len(c["intervals"])):
            start = prev_end + c["intervals"][k]
            intervals.append(float(c["intervals"][k]))
            mem = [n for n in range(N) if excluded_until[n] <= start]
            last_ok = c["success"] and k == len(c["intervals"]) - 1
            if last_ok:
                ok_start, ok_kind = start, "auto"
                break
            stop = start + c["durations"][k]
            b = int(rng.choice(N, p=hazard))
            while excluded_until[b] > start or b not in mem:
                b = int(rng.choice(N, p=hazard))
            attempts.append(dict(start=start, end=stop, members=mem, kind="auto",
                                 state="FAILED", blame=b))
            excluded_until[b] = stop + rng.uniform(300.0, 1200.0)
            exclusions.append(dict(node=node_names[b], time=stop, reason="retry_failed"))
            prev_end = stop
        manual_n, manual_ok = 0, False
        if ok_start is None:
            for (delay, dur, ok) in c["manual"]:
                start = prev_end + delay
                manual_n += 1
                mem = [n for n in range(N) if excluded_until[n] <= start]
                if ok:
                    ok_start, ok_kind, manual_ok = start, "manual", True
                    break
                stop = start + dur
                attempts.append(dict(start=start, end=stop, members=mem, kind="manual",
                                     state="FAILED", blame=None))
                prev_end = stop
        chain_truth.append(dict(failure_time=x, attempts=len(intervals), success=c["success"],
                                manual_attempts=manual_n, manual_success=manual_ok,
                                intervals_s=intervals, recovered_at=ok_start))
        cur_start, cur_kind = ok_start, ok_kind
        t = ok_start
    members = [n for n in range(N) if excluded_until[n] <= cur_start]
    attempts.append(dict(start=cur_start, end=None, members=members, kind=cur_kind,
                         state="RUNNING", blame=None))
    return dict(hazard=hazard, attempts=attempts, failures=failures, other=other,
                exclusions=exclusions, chains=chain_truth, down=down, t_end=t_end)


def _phases(spec: SynthSpec, rng, attempts, t_end):
    """Checkpoint load at each attempt's start, saves every ckpt_every_s of training."""
    phases = []
    for a in attempts:
        end = a["end"] if a["end"] is not None else t_end
        load = spec.ckpt_bytes / (spec.load_Bps * rng.uniform(0.9, 1.1))
        le = min(a["start"] + load, end)
        phases.append(dict(kind="load", start=a["start"], end=le,
                           bytes=(le - a["start"]) / load * spec.ckpt_bytes,
                           members=len(a["members"])))
        s = le + spec.ckpt_every_s
        while s < end:
            dur = spec.ckpt_bytes / (spec.save_Bps * rng.uniform(0.9, 1.1))
            se = min(s + dur, end)
            phases.append(dict(kind="save", start=s, end=se,
                               bytes=(se - s) / dur * spec.ckpt_bytes,
                               members=len(a["members"])))
            s = se + spec.ckpt_every_s
    return [p for p in phases if p["end"] > p["start"]]


# -- the metrics ---------------------------------------------------------------------------

def generate(spec: SynthSpec = SynthSpec()) -> Synth:
    spec.check()
    rng = np.random.default_rng(spec.seed)
    N, G, dt = spec.nodes, spec.gpus, spec.dt
    node_names = [f"gpu{i + 1:03d}" for i in range(N)]
    T = int(round(spec.days * DAY / dt))
    t = spec.start + dt * np.arange(1, T + 1)
    tl = _timeline(spec, rng, node_names)
    phases = _phases(spec, rng, tl["attempts"], tl["t_end"])

    # cluster state per scrape
    running = np.zeros(T)
    member = np.zeros((N, T), bool)
    io_member = np.zeros((N, T), bool)    # in the job for any part of the scrape interval
    for a in tl["attempts"]:
        end = a["end"] if a["end"] is not None else tl["t_end"] + dt
        running += _overlap(t, dt, a["start"], end)
        live = (t >= a["start"]) & (t < end)
        member[np.ix_(a["members"], np.flatnonzero(live))] = True
        part = (t > a["start"]) & (t - dt < end)
        io_member[np.ix_(a["members"], np.flatnonzero(part))] = True
    running = np.clip(running, 0, 1)
    save_f = np.zeros(T)
    load_f = np.zeros(T)
    save_B = np.zeros(T)   # bytes per scrape, cluster-wide
    load_B = np.zeros(T)
    for p in phases:
        f = _overlap(t, dt, p["start"], p["end"])
        rate = p["bytes"] / (p["end"] - p["start"])
        if p["kind"] == "save":
            save_f += f
            save_B += f * dt * rate
        else:
            load_f += f
            load_B += f * dt * rate
    save_f, load_f = np.clip(save_f, 0, 1), np.clip(load_f, 0, 1)
    busy = np.clip(running - load_f, 0, 1)
    a = member * busy[None, :]                               # (N, T) training activity
    n_io = np.maximum(io_member.sum(axis=0), 1)
    diurnal = 1 + 0.1 * np.sin(2 * np.pi * (t - spec.start) / DAY + rng.uniform(0, 2 * np.pi))

    def nodefac(sigma=0.03):
        return np.exp(rng.normal(0, sigma, (N, 1)))

    # multiplicative deviations: precursors and hiccups, per family
    fam = {f: np.ones((N, T)) for f in _HICCUP_FAMILIES}
    hiccups = []
    for n in range(N):
        for _ in range(rng.poisson(spec.hiccups_per_node_day * spec.days)):
            s = int(rng.integers(T))
            d = int(rng.geometric(1 / 3))
            k = int(rng.choice([1, 2, 3], p=[0.55, 0.35, 0.10]))
            fs = [str(x) for x in rng.choice(_HICCUP_FAMILIES, size=k, replace=False)]
            for f in fs:
                fam[f][n, s:s + d] *= rng.uniform(*_HICCUP_SIZE[f])
            hiccups.append(dict(node=node_names[n], time=float(t[min(s, T - 1)]),
                                scrapes=d, families=fs))
    healthy = np.ones((N, T), bool)
    gone = np.zeros((N, T), bool)        # node not reporting (down for repair)
    fx = Effects(N, G, T)
    assign_precursors(spec.shapes, spec.seed, spec.before, spec.gpus, t, tl["failures"], fx)
    for f in tl["failures"]:
        n, g, x = f["node_index"], f["gpu"], f["xid_time"]
        # the failure type's collapse: from the precursor's onset for the report's shapes,
        # from the XID (the failure showing, not a precursor) for every other family
        onset = f["precursor_onset"] if spec.shapes == "report" else x
        on = (t >= min(onset, x)) & (t < x + 1200.0)
        typ = f["type"]
        if typ in ("nvlink", "bus"):
            fam["interrupts"][n, on] *= rng.uniform(0.23, 0.33)
            fam["processes"][n, on] *= 0.02
        elif typ == "gsp":
            fam["processes"][n, on] *= 0.03
            fam["gpu"][n, on] *= 0.05
        else:
            fam["nfs"][n, on] *= rng.uniform(5, 20)
            fam["memory"][n, on] *= rng.uniform(10, 40)
        healthy[n, (t >= min(f["precursor_onset"], x)) & (t < x + 1200.0)] = False
        fx.target("gpu_util")[n, g, (t >= x) & (t < x + 1200.0)] *= 0.02   # the GPU stops
    for (n, lo, hi) in tl["down"]:
        gone[n, (t >= lo) & (t < hi)] = True

    # node_exporter
    series = {}

    def put(name, label, arr):
        series[(name, label)] = arr

    intr_rate = (2000 + 8000 * a) * diurnal * nodefac() * np.exp(_ar1(rng, (N, T), 0.9, 0.05))
    intr_rate *= fam["interrupts"]
    put(M.INTR, "", np.cumsum(intr_rate * dt, axis=1) + rng.uniform(1e8, 1e9, (N, 1)))
    lam = (2 + 38 * a) * diurnal * nodefac() * fam["processes"]
    put(M.PROCS, "", rng.poisson(lam).astype(float))
    # bytes per scrape per node: a save cut short by the job's end still wrote until then
    save_node = save_B[None, :] * io_member / n_io
    load_node = load_B[None, :] * io_member / n_io
    pg_rate = (20 + 80 * a) * diurnal * np.exp(_ar1(rng, (N, T), 0.8, 0.25))
    pg_rate = pg_rate * fam["memory"] + 0.02 * save_node / 4096 / dt
    put(M.PGPGOUT, "", np.cumsum(pg_rate * dt, axis=1) + rng.uniform(1e6, 1e7, (N, 1)))
    rx = (1e8 + 2.4e10 * a) * nodefac(0.02) * np.exp(_ar1(rng, (N, T), 0.9, 0.04)) \
        * fam["net"] * fx.mul_of("net_rx") + load_node / dt
    put(M.NET_RX, "", np.cumsum(rx * dt, axis=1) + rng.uniform(1e12, 1e13, (N, 1)))

    def nfs(op, req_rate, lat, queue_share, sent_Bps=None, recv_Bps=None):
        req = req_rate * dt
        put(M.NFS_REQ, op, np.cumsum(req, axis=1))
        put(M.NFS_RTT, op, np.cumsum(req * lat, axis=1))
        put(M.NFS_QUEUE, op, np.cumsum(req * lat * queue_share, axis=1))
        put(M.NFS_SENT, op, np.cumsum((sent_Bps if sent_Bps is not None else req_rate * 200)
                                      * dt, axis=1))
        put(M.NFS_RECV, op, np.cumsum((recv_Bps if recv_Bps is not None else req_rate * 300)
                                      * dt, axis=1))
        put(M.NFS_MAJOR_TIMEOUTS, op, np.zeros((N, T)))

    nfs("GETATTR", (5 + 10 * a) * diurnal * np.exp(_ar1(rng, (N, T), 0.7, 0.1)),
        0.010 * np.exp(_ar1(rng, (N, T), 0.8, 0.15)) * (1 + 1.5 * save_f) * fam["nfs"], 0.2)
    w_Bps = save_node / dt + 2e6 * a
    w_req = w_Bps / 1048576 + 1.0
    w_lat = (0.02 + 0.5 * save_f) * np.exp(_ar1(rng, (N, T), 0.7, 0.15))
    nfs("WRITE", w_req, w_lat, 0.2 + 0.73 * save_f * np.exp(rng.normal(0, 0.01, (N, T))),
        sent_Bps=w_Bps + w_req * 200)
    r_Bps = load_node / dt + 50e6 * a
    r_req = r_Bps / 1048576 + 1.0
    r_lat = (0.01 + 0.2 * load_f) * np.exp(_ar1(rng, (N, T), 0.7, 0.15))
    nfs("READ", r_req, r_lat, 0.2 + 0.6 * load_f, recv_Bps=r_Bps + r_req * 300)

    # dcgm-exporter
    member_run = member * (running > 0)[None, :]
    _, findings = gpu_metrics(rng, t, a, member_run, diurnal, fam["gpu"], fx, tl["failures"],
                              gone, G, put)
    for fd in findings:
        fd["node"] = node_names[fd.pop("node_index")]
    for key, v in series.items():
        v = np.asarray(v, float)
        v[gone] = np.nan
        series[key] = v

    frame = Frame(t=t, nodes=node_names, series=series)
    kern = kern_lines(spec, rng, tl, node_names, t)
    sacct = sacct_rows(spec, tl, node_names)
    truth = dict(
        spec=asdict(spec), nodes=node_names, start=float(t[0]), end=float(t[-1]), dt=dt,
        failures=[{k: v for k, v in f.items() if k != "node_index"} for f in tl["failures"]],
        other_failures=tl["other"],
        checkpoint_phases=[dict(kind=p["kind"], start=p["start"], end=p["end"],
                                bytes=p["bytes"]) for p in phases],
        exclusions=tl["exclusions"],
        retry_chains=tl["chains"],
        findings=findings,
        hiccups=hiccups,
        hazard={node_names[i]: float(h) for i, h in enumerate(tl["hazard"])},
    )
    return Synth(spec=spec, frame=frame, kern_lines=kern, sacct_rows=sacct, truth=truth,
                 healthy=healthy)


# -- writing -------------------------------------------------------------------------------

def write(s: Synth, out: str | os.PathLike) -> dict[str, str]:
    """Write the four files; their paths by role."""
    from unbroken.learn.openmetrics import write_openmetrics

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"metrics": out / "metrics.om.gz", "kernel_log": out / "kern.log",
             "sacct": out / "sacct.txt", "truth": out / "truth.json"}
    write_openmetrics(s.frame, paths["metrics"])
    paths["kernel_log"].write_text("\n".join(s.kern_lines) + "\n")
    paths["sacct"].write_text("\n".join(sacct_lines(s)) + "\n")
    paths["truth"].write_text(json.dumps(s.truth, indent=1, default=float) + "\n")
    return {k: str(v) for k, v in paths.items()}
