"""XID kernel-log lines, and what each XID asks the recovery ladder to do.

An NVIDIA GPU that fails says so in the kernel log, as a line such as
``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.``
(``dmesg`` adds ``[ 1234.567890] `` in front; syslog adds a date, a host and ``kernel:``). The
number after the PCI address is the XID: it names the failure class, and the class decides the
rung of the ladder without any further diagnosis. That short-circuit is the point of this module:
an XID is post-mortem (backendai.md §2, report Table 7 — DCGM records it only after the GPU has
stopped), so once it is there, waiting for a heartbeat or a collective timeout only loses time.

The catalog is the Backend.AI operations report's Table 3 as encoded by Algalon
(backendai.md §3), not NVIDIA's full catalog, because it is the mapping that was run on a real
cluster; where NVIDIA's own immediate resolution differs the entry says so. Action classes:

* ``restart_app`` — restart the job session on the same node; no node exclusion. The ladder
  *retries in place* (``core.ladder``'s RETRY rung).
* ``reset_gpu`` — the GPU must be reset: the node is *evicted at once* and replaced.
* ``reboot_node`` — the report's ``RESTART_BM`` (restart the bare-metal node): *evicted at
  once*; repeated occurrences mean hardware replacement (contact support), which the
  ladder's eviction history (``core.exclusion``) turns into a quarantine.
* ``investigate`` — the default for every XID not in Table 3 ("other ≠ 0"): a warning for a
  human; the XID alone moves no rung, the other detectors decide.
* ``ignore`` — XID 0 only: DCGM's XID gauge reads 0 when no XID occurred, and Algalon's rule
  is ``xid != 0``.

Parsing is strict where it matters: a line that is not an XID line is ``None`` (kernel logs are
mostly other things), but a line that *claims* to be one (``NVRM: Xid``) and cannot be read
raises ``XidParseError`` naming the line — a silently dropped XID is a missed eviction.
``scan`` is the detector's form: it never raises on a line, it returns the malformed lines
beside the events, so one broken line cannot stop a detector.

Pure: no I/O (the caller reads ``dmesg`` or a file and passes the lines), no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "RESTART_APP",
    "RESET_GPU",
    "REBOOT_NODE",
    "INVESTIGATE",
    "IGNORE",
    "ACTIONS",
    "EVICT_AT_ONCE",
    "RETRY_IN_PLACE",
    "XidInfo",
    "XID_CATALOG",
    "XidEvent",
    "XidParseError",
    "MalformedLine",
    "XidScan",
    "action_for",
    "parse_xid_line",
    "scan",
]

RESTART_APP = "restart_app"
RESET_GPU = "reset_gpu"
REBOOT_NODE = "reboot_node"
INVESTIGATE = "investigate"
IGNORE = "ignore"
ACTIONS = (RESTART_APP, RESET_GPU, REBOOT_NODE, INVESTIGATE, IGNORE)

#: Classes that evict the node at once (skip the retry-in-place rungs).
EVICT_AT_ONCE = frozenset({RESET_GPU, REBOOT_NODE})
#: Classes that restart the application where it is (the retry rungs).
RETRY_IN_PLACE = frozenset({RESTART_APP})


class XidParseError(ValueError):
    """A line that says it is an XID line but cannot be read, or an XID code that is not one;
    the one-line message names the line or the value."""


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str      # the reference's "meaning" column
    action: str    # one of ACTIONS
    severity: str  # "warning" or "critical", as the reference gives it
    note: str = ""  # where NVIDIA's catalog or the reference adds something


# backendai.md §3, "XID taxonomy and XID → action mapping (report Table 3, as encoded in [A])".
XID_CATALOG: dict[int, XidInfo] = {
    # "31 | GPU memory page fault | RESTART_APP (restart the job session; no node exclusion)
    #  | warning"
    31: XidInfo(31, "GPU memory page fault", RESTART_APP, "warning",
                "restart the job session; no node exclusion"),
    # "43 | GPU stopped processing | RESTART_APP | warning"
    43: XidInfo(43, "GPU stopped processing", RESTART_APP, "warning",
                "NVIDIA's catalog says IGNORE; the report restarts the app"),
    # "94 | contained ECC error | RESTART_APP | warning"
    94: XidInfo(94, "contained ECC error", RESTART_APP, "warning"),
    # "119 | GSP RPC timeout | RESET_GPU | critical"
    119: XidInfo(119, "GSP RPC timeout", RESET_GPU, "critical"),
    # "145 | NVLink RLW error | RESET_GPU | critical"
    145: XidInfo(145, "NVLink RLW error", RESET_GPU, "critical",
                 "NVIDIA: WORKFLOW_NVLINK5_ERR, by subcode IGNORE or RESET_GPU"),
    # "149 | NVLink NETIR error | RESET_GPU | critical"
    149: XidInfo(149, "NVLink NETIR error", RESET_GPU, "critical",
                 "NVIDIA: WORKFLOW_NVLINK5_ERR, by subcode IGNORE or RESET_GPU"),
    # "79 | GPU fell off the bus | RESTART_BM (reboot the node). Repeated occurrences mean
    #  hardware replacement, i.e. contact support | critical"
    79: XidInfo(79, "GPU fell off the bus", REBOOT_NODE, "critical",
                "RESTART_BM; repeated occurrences mean hardware replacement (contact support)"),
}


def _code(code: object) -> int:
    if isinstance(code, bool) or not isinstance(code, int):
        try:
            text = str(code).strip()
            if not text.isdigit():
                raise ValueError
            return int(text)
        except (ValueError, TypeError):
            raise XidParseError(f"XID code {code!r} is not a non-negative integer") from None
    if code < 0:
        raise XidParseError(f"XID code {code} is negative")
    return code


def action_for(code: int) -> tuple[str, str]:
    """The action class of XID ``code`` and a reason that doubles as the log line.

    Codes in Table 3 get their class; 0 is ``ignore`` (no XID); any other code is
    ``investigate`` (the reference's "other ≠ 0" row). A code that is not a non-negative
    integer (``"abc"``, ``-1``, ``True``) raises XidParseError.
    """
    c = _code(code)
    info = XID_CATALOG.get(c)
    if info is not None:
        then = ("evict at once" if info.action in EVICT_AT_ONCE
                else "retry in place")
        note = f"; {info.note}" if info.note else ""
        return info.action, f"XID {c} ({info.name}, {info.severity}): {info.action}, {then}{note}"
    if c == 0:
        return IGNORE, "XID 0: no XID (DCGM's gauge reads 0 when none occurred)"
    return INVESTIGATE, (f"XID {c}: not in the catalog (backendai.md §3 Table 3): investigate "
                         f"(warning; no rung moved by the XID alone)")


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str                  # e.g. "0000:3b:00" (the "PCI:" prefix dropped)
    pid: int | None           # None when the driver printed no pid or pid='<unknown>'
    message: str              # the driver's text after the code, pid and name
    timestamp: float | None   # dmesg's seconds since boot ("[ 1234.567890]"), if present
    line: str                 # the line as given (trailing newline removed)

    @property
    def action(self) -> str:
        return action_for(self.code)[0]


# Anything that says it is an XID line. Real lines say exactly "NVRM: Xid"; a case or spacing
# variant is still an XID the driver meant to report, so it must not pass silently as "no XID".
_CLAIM = re.compile(r"NVRM\s*:\s*xid\b", re.IGNORECASE)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):"
    r" ?(?P<code>\d+)(?P<rest>(?:,.*)?)$")
_STAMP = re.compile(r"\[\s*(?P<t>\d+\.\d+)\s*\]\s*$")
_PID = re.compile(r"^\s*pid=(?P<pid>\d+|'?<unknown>'?)\s*(?:,|$)")
_NAME = re.compile(r"^\s*name=(?P<name>[^,]*)(?:,|$)")
_MAX_SHOWN = 200


def _shown(line: str) -> str:
    return repr(line if len(line) <= _MAX_SHOWN else line[:_MAX_SHOWN] + "...")


def parse_xid_line(line: str | bytes) -> XidEvent | None:
    """The XID event on ``line``, ``None`` if the line is not an XID line.

    Accepted forms (the timestamp is optional, anything before ``NVRM:`` is a prefix)::

        NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
        [ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.
        Jan  2 03:04:05 n71 kernel: [ 88.0] NVRM: Xid (PCI:0000:18:00): 119, pid='<unknown>', ...
        NVRM: Xid (0000:3b:00): 43, Ch 00000010

    A line that contains ``NVRM: Xid`` in any case but does not have this shape (no code,
    a non-numeric code, no PCI address, a bad pid field) raises XidParseError naming the line.
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    if not isinstance(line, str):
        raise XidParseError(f"XID line {line!r} is a {type(line).__name__}, not text")
    text = line.rstrip("\r\n")
    claim = _CLAIM.search(text)
    if claim is None:
        return None
    m = _XID.match(text, claim.start())
    if m is None:
        raise XidParseError(f"malformed XID line {_shown(text)}: expected "
                            f"'NVRM: Xid (PCI:dddd:bb:dd): CODE, ...'")
    code = int(m.group("code"))
    rest = m.group("rest")[1:] if m.group("rest") else ""
    pid = None
    pm = _PID.match(rest)
    if pm is not None:
        if pm.group("pid").isdigit():
            pid = int(pm.group("pid"))
        rest = rest[pm.end():]
    elif rest.lstrip().startswith("pid="):
        raise XidParseError(f"malformed XID line {_shown(text)}: bad pid field "
                            f"(expected pid=NUMBER or pid='<unknown>')")
    nm = _NAME.match(rest)
    if nm is not None:
        rest = rest[nm.end():]
    st = _STAMP.search(text, 0, claim.start())
    timestamp = float(st.group("t")) if st is not None else None
    return XidEvent(code=code, pci=m.group("pci").lower(), pid=pid, message=rest.strip(),
                    timestamp=timestamp, line=text)


class MalformedLine(NamedTuple):
    lineno: int  # 1-based position in the scanned lines
    line: str
    error: str   # the XidParseError message


class XidScan(NamedTuple):
    events: list[XidEvent]
    malformed: list[MalformedLine]


def scan(lines: Iterable[str | bytes]) -> XidScan:
    """Every XID event in ``lines``, in order, and the malformed XID lines beside them.

    Never raises on a line: a detector that reads a live log must keep reading past a torn or
    garbled line, and must still be able to report it. Unpacks as ``events, malformed``.
    """
    events: list[XidEvent] = []
    malformed: list[MalformedLine] = []
    for i, line in enumerate(lines, start=1):
        try:
            ev = parse_xid_line(line)
        except XidParseError as e:
            text = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
            malformed.append(MalformedLine(i, text.rstrip("\r\n"), str(e)))
            continue
        if ev is not None:
            events.append(ev)
    return XidScan(events, malformed)
