"""Node loss under node agents: how fast a lost node is found and masked.

Prints ONE JSON object on stdout (progress on stderr). ``unbroken run``'s supervisor in this
process, ``--trainer mlp``, 6 groups (r = 2) on 3 local node agents (``--local-nodes 3``), one
fault per run at step 10 of ``--steps``, ``--repeats`` runs per case, median / min / max:

* ``kill``: ``node:1@10``, the agent SIGKILLed with its process group (its workers follow);
* ``cut``: ``cut:1@10``, the agent SIGSTOPped, its workers running on (found by silence,
  ``--node-staleness``);
* ``group_kill`` (the baseline: what the supervisor already does for one process, no agents):
  ``kill:1@10`` under the plain ``StackedCluster``;
* ``remote_kill``: ``--nodes 3``, the three agents started as processes of their own
  (``unbroken agent --coordinator <this host's default-route address>:PORT``, as on other
  machines) and agent 1's process group SIGKILLed from outside once step 10 is in: the
  coordinator did not start it, so only silence tells. Times from the kill.
* ``remote_cut``: as ``remote_kill``, but agent 1 runs in a network namespace of its own
  (``unbroken.testing.netns``: another address behind a veth link; root only) and at step 10
  the link goes down: nothing dies, packets are dropped. Also ``agent_left_s``: when the
  cut-off agent, its heartbeat blocked, killed its workers and left (exit 10).

Metrics from the merged journal, all relative to the fault event's wall time: ``node_lost_s``
(the coordinator's ``node_lost``), ``detected_s`` (the supervisor's last ``detected`` of the
fault's members), ``masked_s`` (the first ``replan`` whose members exclude them, i.e. the
survivors re-formed without them); plus ``exactly_once`` and ``restarts`` of each run.

Usage: ``.venv/bin/python bench/node_loss.py [--repeats 3] [--steps 200]
[--node-staleness 1.0] [--cases kill,cut,group_kill,remote_kill,remote_cut]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from unbroken.events import Event
from unbroken.supervise import JobSpec, Supervisor
from unbroken.supervise.spec import FTConfig

CASES = {"kill": ("node:1@10", 3), "cut": ("cut:1@10", 3), "group_kill": ("kill:1@10", 0),
         "remote_kill": (None, 3), "remote_cut": (None, 3)}


def one(case: str, steps: int, staleness: float, out: Path) -> dict:
    if case.startswith("remote_"):
        return one_remote(steps, staleness, out, cut=case == "remote_cut")
    faults, nodes = CASES[case]
    spec = JobSpec(trainer="mlp", groups=6, steps=steps, faults=faults, local_nodes=nodes,
                   out=str(out), timeout=600, ft=FTConfig(node_staleness=staleness))
    sup = Supervisor(spec)
    res = sup.run()
    hit = [e for e in sup.events if e["event"] == Event.FAULT]
    return metrics(sup.events, hit[0]["t"], {e.get("uid", e["group"]) for e in hit}, res)


def metrics(ev: list[dict], t0: float, uids: set, res) -> dict:
    """One run's times after the fault at ``t0`` that took ``uids``, and its checks."""
    lost = [e["t"] - t0 for e in ev if e["event"] == Event.NODE_LOST]
    det = [e["t"] - t0 for e in ev if e["event"] == Event.DETECTED and e["group"] in uids]
    masked = [e["t"] - t0 for e in ev if e["event"] == Event.REPLAN
              and not uids & set(e.get("members", []))]
    return {"node_lost_s": lost[0] if lost else None, "detected_s": max(det) if det else None,
            "masked_s": min(masked) if masked else None,
            "exactly_once": res.report.get("exactly_once"),
            "restarts": res.report.get("restarts"), "ok": res.ok}


def one_remote(steps: int, staleness: float, out: Path, cut: bool = False) -> dict:
    """Agents started by hand, one killed from outside at step 10, or (``cut``) agent 1 in a
    network namespace of its own whose link goes down at step 10 (see the module doc)."""
    import os
    import signal
    import socket
    import subprocess
    import threading
    import time

    ns = None
    if cut:
        from unbroken.testing.netns import NetNs

        ns = NetNs(os.getpid())
        addr = ns.host_addr
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.254", 9))  # the default route's address; nothing is sent
            addr = s.getsockname()[0]
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    spec = JobSpec(trainer="mlp", groups=6, steps=steps, nodes=3, listen=port, out=str(out),
                   timeout=600, ft=FTConfig(node_staleness=staleness))
    sup, got = Supervisor(spec), {}
    run = threading.Thread(target=lambda: got.update(res=sup.run()), daemon=True)
    run.start()
    agents = [subprocess.Popen([*(ns.prefix() if ns is not None and k == 1 else []),
                                sys.executable, "-m", "unbroken", "agent", "--coordinator",
                                f"{addr}:{port}", "--node", str(k), "--connect-timeout", "120"],
                               stderr=subprocess.DEVNULL, start_new_session=True)
              for k in range(3)]
    left: dict = {}
    try:
        while not any(e["event"] == Event.COMMIT and e["step"] >= 10 for e in list(sup.events)):
            if not run.is_alive():
                raise RuntimeError("the job ended before step 10")
            time.sleep(0.005)
        t0 = time.time()
        if ns is not None:
            ns.cut()
            # when the cut-off agent fenced itself (its heartbeat blocked: nodes.agent._Beat)
            threading.Thread(target=lambda: left.update(
                code=agents[1].wait(), s=time.time() - t0), daemon=True).start()
        else:
            os.killpg(agents[1].pid, signal.SIGKILL)
        run.join()
    finally:  # the others leave when the job ends (exit 0)
        for a in agents:
            try:
                a.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait()
        if ns is not None:
            ns.close()
    m = metrics(sup.events, t0, {1, 4}, got["res"])  # node 1 of 3 holds groups 1 and 4
    if ns is not None:
        m["agent_left_s"], m["agent_code"] = left.get("s"), left.get("code")
    return m


def summary(xs: list) -> dict | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
            "max": round(max(xs), 4), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--node-staleness", type=float, default=1.0)
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, of {', '.join(CASES)}")
    a = ap.parse_args()
    out: dict = {"groups": 6, "redundancy": 2, "nodes": 3, "steps": a.steps,
                 "node_staleness_s": a.node_staleness, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases.split(","):
            runs = []
            for i in range(a.repeats):
                print(f"{case} {i + 1}/{a.repeats}", file=sys.stderr, flush=True)
                runs.append(one(case, a.steps, a.node_staleness, Path(tmp) / f"{case}-{i}"))
            out["cases"][case] = {
                **{k: summary([r.get(k) for r in runs])
                   for k in ("node_lost_s", "detected_s", "masked_s", "agent_left_s")},
                "all_exactly_once": all(r["exactly_once"] for r in runs),
                "restarts": sum(r["restarts"] or 0 for r in runs),
                "all_ok": all(r["ok"] for r in runs)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
