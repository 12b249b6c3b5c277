"""Kernel logs with XID lines, as files: every XID with its wall-clock time and its node.

The XID itself is parsed by the guard's parser (``core.xid.scan``: strict about lines that
claim to be XIDs, never raising on one); this module adds what an offline analysis needs and a
live tail does not: the time and the host. Accepted prefixes, as ``rsyslog``
(RFC 3339), ``journalctl -o short-iso`` and ``dmesg --time-format iso`` write them::

    2026-11-01T03:04:05.123456+00:00 gpu071 kernel: [88.0] NVRM: Xid (PCI:0000:18:00): 79, ...
    2026-11-01T03:04:05+0000 gpu071 kernel: NVRM: Xid (PCI:0000:18:00): 79, ...
    2026-11-01T03:04:05,123456+00:00 NVRM: Xid (PCI:0000:18:00): 79, ...   (dmesg: no host)

Without a host field the node is the file's name up to the first dot (``gpu071.log``). An XID
line without a readable time is reported (line number) and skipped: an XID at an unknown time
cannot be matched with anything.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass

from unbroken.core.xid import action_for, scan

__all__ = ["XidRecord", "read_kernel_logs", "KernelLogError"]

_PREFIX = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
                     r"\s+(?:(?P<host>[A-Za-z0-9_.-]+)\s+kernel:)?")


class KernelLogError(ValueError):
    """A kernel log that cannot be read at all."""


@dataclass(frozen=True)
class XidRecord:
    node: str
    time: float
    code: int
    pci: str
    action: str


def _when(text: str) -> float:
    text = text.replace(",", ".")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    elif re.search(r"[+-]\d{4}$", text):
        text = text[:-2] + ":" + text[-2:]
    t = dt.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def read_kernel_logs(paths: list[str]) -> tuple[list[XidRecord], list[str]]:
    out: list[XidRecord] = []
    warnings: list[str] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except OSError as e:
            raise KernelLogError(f"--kernel-log {path}: {e.strerror or e}") from None
        base = os.path.basename(path).split(".", 1)[0]
        numbered = [(i, ln) for i, ln in enumerate(lines, 1) if "xid" in ln.lower()]
        events, bad = scan(ln for _, ln in numbered)
        for m in bad:
            warnings.append(f"{os.path.basename(path)}:{numbered[m.lineno - 1][0]}: {m.error}")
        for ev in events:
            m = _PREFIX.match(ev.line)
            lineno = next(i for i, ln in numbered if ln.rstrip("\r\n") == ev.line)
            if m is None:
                warnings.append(f"{os.path.basename(path)}:{lineno}: XID {ev.code} line "
                                f"without a readable time skipped")
                continue
            try:
                when = _when(m.group("ts"))
            except ValueError:
                warnings.append(f"{os.path.basename(path)}:{lineno}: bad time "
                                f"{m.group('ts')!r}; XID line skipped")
                continue
            out.append(XidRecord(m.group("host") or base, when, ev.code, ev.pci,
                                 action_for(ev.code)[0]))
    return sorted(out, key=lambda r: r.time), warnings
