"""Coordinator loss under ``--store etcd://``: SIGKILL the active supervisor, time the standby.

Prints ONE JSON object on stdout (progress on stderr). A real 3-member etcd cluster
(``unbroken.testing.etcd_cluster``, Debian's etcd) on local ports; ``unbroken run --trainer
mlp`` as real processes:

* ``loss``: at each of ``--groups`` (default 4 and 16), an active supervisor and a standby
  (``--standby``, same flags, ``--lease-ttl``); the active one is SIGKILLed once step
  ``--kill-at`` is committed and the standby says it stands by (warm: a standby of a long job
  is); ``kill_to_commit_s`` is the time from the kill to the first
  commit under the standby (after it adopted the members, or after their restore when it
  restarted them), median / min / max over ``--repeats``; ``pause_s`` the gap between the
  last commit before and the first after; with ``how`` (adopted / restarted),
  ``exactly_once``, the step the job went on from, ``connected_ahead`` (members that had
  connected to the standby's store before the kill) and ``split``: where the time went --
  ``lease_s`` kill -> the standby holds the lease, ``setup_s`` -> its store published,
  ``reports_s`` -> every member re-attached, ``go_s`` -> the go, ``first_step_s`` -> the
  first commit.
* ``agents`` (``--agents-ranks 1,2``): the same kill with the workers under two node agents
  that follow the job through etcd (``unbroken agent --store ... --job``, started here as an
  operator would), 4 groups of R ranks each (``--shard fsdp`` for R > 1): the agents outlive
  the coordinator and keep their workers, which the standby adopts. Per R the same fields as
  ``loss``, and ``r2_over_r1``: the ratio of the medians. ``after_lease_s`` (here and in
  ``loss``): the kill -> commit time past the lease's expiry, what the takeover itself costs
  (the TTL is a setting), and ``r2_over_r1_after_lease`` its ratio.
* ``overhead``: the same failure-free job (4 groups, ``--steps``) with the embedded TCPStore
  and with etcd, alternated ``--repeats`` times; the report's median step time ``step_s`` of
  each, their medians and ``ratio`` = etcd / tcp. Nothing per step is written to etcd; the
  etcd revisions the etcd runs added are reported (``etcd_writes_per_run``).

Usage: ``.venv/bin/python bench/coordinator_loss.py [--repeats 3] [--groups 4,16]
[--agents-ranks 1,2] [--steps 1500] [--kill-at 40] [--lease-ttl 2] [--skip-overhead]
[--out docs/bench/coordinator_loss.json]`` (an empty ``--groups`` or ``--agents-ranks``
skips that part).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from unbroken.coord.etcd import Etcd
from unbroken.core.coordination import job_prefix
from unbroken.testing.etcd_cluster import EtcdCluster

JOB = ["run", "--trainer", "mlp", "--faults", "none", "--spares", "0", "--json"]


def _events(out: Path, kind: str) -> list[dict]:
    evs = []
    for f in sorted((out / "groups").glob("group-*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line still being written
            if e.get("event") == kind:
                evs.append(e)
    return evs


def _journal(out: Path) -> list[dict]:
    evs = []
    for line in (out / "journal.jsonl").read_text(errors="replace").splitlines():
        try:
            evs.append(json.loads(line))
        except ValueError:
            continue  # the killed supervisor's last line
    return evs


def _standing_by(cluster: EtcdCluster, job: str) -> bool:
    """The standby announced itself in etcd (``standbys/<name>``): it does so warm (checked,
    its fork server's imports done), as a standby of a long job is. Killing the active one
    earlier timed the standby's torch import, not the takeover."""
    return bool(Etcd(cluster.endpoints).get_prefix(job_prefix(job) + "standbys/"))


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "unbroken", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _poll(cond, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting (rc {proc.poll()}): "
                               f"{proc.stderr.read()[-1500:] if proc.poll() is not None else ''}")
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass


def loss(cluster: EtcdCluster, groups: int, steps: int, kill_at: int, ttl: int, out: Path,
         job: str, ranks: int | None = None) -> dict:
    """``ranks``: the workers run under two node agents (``--nodes 2``), R ranks a group;
    None: under the supervisor itself."""
    args = (*JOB, "--groups", str(groups), "--steps", str(steps), "--ckpt-every", "20",
            "--out", str(out), "--store", cluster.url, "--job", job, "--lease-ttl", str(ttl))
    if ranks is not None:
        args += ("--nodes", "2", *(("--ranks-per-group", str(ranks), "--shard", "fsdp")
                                   if ranks > 1 else ()))
    active = _start(*args)
    standby, agents = None, []
    try:
        if ranks is not None:  # started by hand, as on the nodes: they outlive a coordinator
            agents = [subprocess.Popen(
                [sys.executable, "-m", "unbroken", "agent", "--store", cluster.url, "--job",
                 job, "--node", str(k), "--connect-timeout", "120"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for k in (0, 1)]
        _poll(lambda: bool(_events(out, "commit")), active, 300)
        standby = _start(*args, "--standby")
        _poll(lambda: _standing_by(cluster, job), active, 300)
        _poll(lambda: max(e["step"] for e in _events(out, "commit")) >= kill_at, active, 300)
        active.send_signal(signal.SIGKILL)
        t_kill = time.time()
        active.wait(timeout=30)
        rc = standby.wait(timeout=600)
        rep = json.loads(standby.stdout.read() or "{}")
        agent_rcs = [p.wait(timeout=60) for p in agents]
    finally:
        for p in (active, standby, *agents):
            if p is not None and p.poll() is None:
                p.kill()
    # adopted (no restart): every member journals "adopted" at the go; a restart: "restore"
    adopted = [e for e in _events(out, "adopted") if e["t"] > t_kill]
    restores = [e for e in _events(out, "restore") if e["t"] > t_kill]
    t_go = max(e["t"] for e in adopted) if adopted else min(e["t"] for e in restores)
    commits = _events(out, "commit")
    first = min(e["t"] for e in commits if e["t"] > t_go)
    last = max(e["t"] for e in commits if e["t"] < t_go)
    tk = [e for e in _journal(out) if e.get("event") == "takeover"]
    split = {}
    if tk and tk[0].get("lease_t"):  # where the time went: lease wait, set-up, reports, go
        t_lease, t_dec = tk[0]["lease_t"], tk[0]["t"]
        split = {"lease_s": t_lease - t_kill, "setup_s": t_dec - tk[0]["adopted_s"] - t_lease,
                 "reports_s": tk[0]["adopted_s"], "go_s": t_go - t_dec,
                 "first_step_s": first - t_go}
    return {"rc": rc, "how": "adopted" if adopted and not restores else "restarted",
            "kill_to_commit_s": first - t_kill, "pause_s": first - last, "split": split,
            "resumed_at": (adopted or restores)[0].get("step"),
            "exactly_once": rep.get("exactly_once"),
            "connected_ahead": sum(bool(e.get("ahead")) for e in adopted),
            **({"agent_rcs": agent_rcs} if agents else {})}


def step_time(cluster: EtcdCluster | None, steps: int, out: Path, job: str) -> dict:
    store = ["--store", cluster.url, "--job", job] if cluster else []
    etcd = Etcd(cluster.endpoints) if cluster else None
    rev0 = int(etcd.status()["header"]["revision"]) if etcd else 0
    p = subprocess.run([sys.executable, "-m", "unbroken", *JOB, "--groups", "4", "--steps",
                        str(steps), "--ckpt-every", "50", "--out", str(out), *store],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-1500:])
    rep = json.loads(p.stdout)
    return {"step_s": rep["step_s"], "wall_s": rep["wall_s"],
            "etcd_writes": int(etcd.status()["header"]["revision"]) - rev0 if etcd else 0}


def _summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--groups", default="4,16")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--kill-at", type=int, default=40)
    ap.add_argument("--lease-ttl", type=int, default=2)
    ap.add_argument("--agents-ranks", default="1,2",
                    help="ranks a group of the runs under node agents (4 groups)")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--out", default=None, help="also write the JSON object here")
    a = ap.parse_args()
    res: dict = {"lease_ttl_s": a.lease_ttl, "kill_at": a.kill_at, "steps": a.steps,
                 "repeats": a.repeats, "loss": {}, "agents": {}, "overhead": {}}

    def runs_of(key: str, make) -> dict:
        runs = []
        for r in range(a.repeats):
            runs.append(make(r))
            print(f"{key} run {r}: {runs[-1]}", file=sys.stderr)
        # past the lease's expiry: what the takeover itself costs (the TTL is a setting)
        past = [x["kill_to_commit_s"] - x["split"]["lease_s"] for x in runs if x["split"]]
        return {"kill_to_commit_s": _summary([x["kill_to_commit_s"] for x in runs]),
                "after_lease_s": _summary(past) if past else None,
                "pause_s": _summary([x["pause_s"] for x in runs]), "runs": runs}

    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(Path(tmp), n=3) as cluster:
        root = Path(tmp)
        for g in [int(x) for x in a.groups.split(",") if x]:
            res["loss"][str(g)] = runs_of(f"groups {g}", lambda r, g=g: loss(
                cluster, g, a.steps, a.kill_at, a.lease_ttl, root / f"loss-{g}-{r}",
                f"loss-{g}-{r}"))
        for k in [int(x) for x in a.agents_ranks.split(",") if x]:
            res["agents"][str(k)] = runs_of(f"agents R={k}", lambda r, k=k: loss(
                cluster, 4, a.steps, a.kill_at, a.lease_ttl, root / f"agents-{k}-{r}",
                f"agents-{k}-{r}", ranks=k))
        if "1" in res["agents"] and "2" in res["agents"]:
            one, two = res["agents"]["1"], res["agents"]["2"]
            res["agents"]["r2_over_r1"] = (two["kill_to_commit_s"]["median"]
                                           / one["kill_to_commit_s"]["median"])
            if one["after_lease_s"] and two["after_lease_s"]:
                res["agents"]["r2_over_r1_after_lease"] = (two["after_lease_s"]["median"]
                                                           / one["after_lease_s"]["median"])
        if a.skip_overhead:
            res.pop("overhead")
        else:
            tcp, etc = [], []
            for r in range(a.repeats):
                tcp.append(step_time(None, a.steps, root / f"tcp-{r}", ""))
                etc.append(step_time(cluster, a.steps, root / f"etcd-{r}", f"ovh-{r}"))
                print(f"overhead run {r}: tcp {tcp[-1]} etcd {etc[-1]}", file=sys.stderr)
            t_med = statistics.median(x["step_s"] for x in tcp)
            e_med = statistics.median(x["step_s"] for x in etc)
            res["overhead"] = {"groups": 4,
                               "tcp_step_s": _summary([x["step_s"] for x in tcp]),
                               "etcd_step_s": _summary([x["step_s"] for x in etc]),
                               "ratio": e_med / t_med,
                               "etcd_writes_per_run": [x["etcd_writes"] for x in etc]}
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
