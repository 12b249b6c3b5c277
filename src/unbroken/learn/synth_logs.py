"""The synthetic cluster's logs: kernel XID lines (syslog form) and the sacct job history.

Why apart from ``learn.synth``: the metrics and the logs are written from the same timeline but
in formats that have nothing in common; the readers (``learn.kernlog``, ``learn.sacct``) are
tested against these writers.
"""

from __future__ import annotations

import datetime as _dt

__all__ = ["kern_lines", "hostlist", "sacct_rows", "sacct_lines", "SACCT_FIELDS", "iso",
           "PCI"]

PCI = ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00",
       "0000:9a:00", "0000:ab:00", "0000:ba:00", "0000:db:00"]
JOB = "pretrain-llm"


def iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def kern_lines(spec, rng, tl, node_names, t):
    lines = []
    boot = {n: float(rng.uniform(1e5, 1e6)) for n in node_names}
    for f in tl["failures"]:
        info = {79: "GPU has fallen off the bus.", 94: "Contained: SM (0x1). RST: No, D-RST: No",
                119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
                145: "RLW_REMAP Nonfatal XC0 i0 Link 07 (0x00000004 0x00000000)",
                149: "NETIR_LINK_EVT Fatal XC0 i0 Link 12 (0x00000004 0x00000000)"}
        x = f["xid_time"]
        up = x - spec.start + boot[f["node"]]
        lines.append((x, f"{iso(x)}.{int((x % 1) * 1e6):06d}+00:00 {f['node']} kernel: "
                         f"[{up:.6f}] NVRM: Xid (PCI:{PCI[f['gpu']]}): {f['xid']}, "
                         f"pid={int(rng.integers(1000, 99999))}, name=python, {info[f['xid']]}"))
    for _ in range(int(40 * spec.days)):
        x = float(rng.uniform(t[0], t[-1]))
        n = node_names[int(rng.integers(len(node_names)))]
        msg = str(rng.choice(["mlx5_core 0000:1a:00.0: Port module event: module 0, Cable plugged",
                              "nfs: server storage01 OK",
                              "systemd-journald[812]: Data hash table reached maximum size",
                              "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode"]))
        up = x - spec.start + boot[n]
        lines.append((x, f"{iso(x)}.000000+00:00 {n} kernel: [{up:.6f}] {msg}"))
    lines.sort()
    return [s for _, s in lines]


def hostlist(nodes: list[str]) -> str:
    """Slurm's compressed host list: gpu001,gpu002,gpu005 -> gpu[001-002,005]."""
    if not nodes:
        return "None assigned"
    prefix = nodes[0].rstrip("0123456789")
    width = len(nodes[0]) - len(prefix)
    nums = sorted(int(n[len(prefix):]) for n in nodes)
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        a, b = f"{nums[i]:0{width}d}", f"{nums[j]:0{width}d}"
        parts.append(a if i == j else f"{a}-{b}")
        i = j + 1
    return f"{prefix}[{','.join(parts)}]"


def sacct_rows(spec, tl, node_names):
    rows = []
    restarts = 0
    for i, a in enumerate(tl["attempts"]):
        comment = []
        if a["kind"] in ("auto", "manual"):
            comment.append(f"retry={a['kind']}")
        if a["blame"] is not None:
            comment.append(f"exclude={node_names[a['blame']]}")
        restarts = restarts + 1 if a["kind"] == "auto" else 0
        ec = "0:0" if a["state"] in ("RUNNING", "COMPLETED") else "1:0"
        rows.append(dict(JobID=str(100000 + i), JobName=JOB, State=a["state"], ExitCode=ec,
                         Submit=iso(a["start"] - 5), Start=iso(a["start"]),
                         End=iso(a["end"]) if a["end"] is not None else "Unknown",
                         NodeList=hostlist([node_names[n] for n in a["members"]]),
                         Restarts=str(restarts), Comment=";".join(comment)))
    return rows


SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Submit", "Start", "End", "NodeList",
                "Restarts", "Comment")


def sacct_lines(s) -> list[str]:
    """A Synth's job history as ``sacct --parsable2`` lines (header first)."""
    return ["|".join(SACCT_FIELDS)] + ["|".join(r[k] for k in SACCT_FIELDS) for r in s.sacct_rows]
