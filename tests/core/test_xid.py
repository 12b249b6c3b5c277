"""XID catalog (backendai.md §3 Table 3), kernel-log line parsing, and the never-raising scan."""

import pytest

from unbroken.core.xid import (
    ACTIONS,
    EVICT_AT_ONCE,
    IGNORE,
    INVESTIGATE,
    REBOOT_NODE,
    RESET_GPU,
    RESTART_APP,
    RETRY_IN_PLACE,
    XID_CATALOG,
    XidEvent,
    XidParseError,
    action_for,
    parse_xid_line,
    scan,
)

# backendai.md §3, copied by hand from the table (not from the module under test).
TABLE_3 = {
    31: (RESTART_APP, "warning"),
    43: (RESTART_APP, "warning"),
    94: (RESTART_APP, "warning"),
    119: (RESET_GPU, "critical"),
    145: (RESET_GPU, "critical"),
    149: (RESET_GPU, "critical"),
    79: (REBOOT_NODE, "critical"),
}


@pytest.mark.parametrize("code", sorted(TABLE_3))
def test_every_table_3_entry_maps_to_the_reference_class(code):
    action, reason = action_for(code)
    assert action == TABLE_3[code][0]
    assert XID_CATALOG[code].severity == TABLE_3[code][1]
    assert f"XID {code}" in reason and action in reason and "\n" not in reason


def test_catalog_is_exactly_table_3():
    assert set(XID_CATALOG) == set(TABLE_3)
    assert all(info.code == code and info.action in ACTIONS for code, info in XID_CATALOG.items())


def test_short_circuit_classes():
    # reset-GPU and reboot classes evict at once; restart-app classes retry (issue 4)
    assert EVICT_AT_ONCE == {RESET_GPU, REBOOT_NODE}
    assert RETRY_IN_PLACE == {RESTART_APP}
    assert "evict at once" in action_for(79)[1] and "evict at once" in action_for(119)[1]
    assert "retry in place" in action_for(31)[1]
    assert "contact support" in action_for(79)[1]


@pytest.mark.parametrize("code", [13, 48, 63, 64, 74, 92, 95, 120, 999999])
def test_unknown_codes_default_to_investigate(code):
    action, reason = action_for(code)
    assert action == INVESTIGATE
    assert str(code) in reason and "not in the catalog" in reason


def test_zero_is_no_xid_and_string_codes_are_read():
    assert action_for(0)[0] == IGNORE
    assert action_for("79")[0] == REBOOT_NODE


@pytest.mark.parametrize("bad", [-1, "abc", "7.9", 79.0, True, None])
def test_bad_codes_raise_naming_the_value(bad):
    with pytest.raises(XidParseError) as ei:
        action_for(bad)
    assert repr(bad) in str(ei.value) or str(bad) in str(ei.value)
    assert "\n" not in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_parse_plain_line():
    ev = parse_xid_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    assert ev == XidEvent(code=79, pci="0000:3b:00", pid=1234,
                          message="GPU has fallen off the bus.", timestamp=None,
                          line="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off "
                               "the bus.")
    assert ev.action == REBOOT_NODE


def test_parse_dmesg_timestamp_name_and_newline():
    line = ("[ 1234.567890] NVRM: Xid (PCI:0000:18:00): 119, pid=2819, name=python3, "
            "Timeout after 6s of waiting for RPC response from GPU1 GSP!\n")
    ev = parse_xid_line(line)
    assert (ev.code, ev.pci, ev.pid, ev.timestamp) == (119, "0000:18:00", 2819, 1234.56789)
    assert ev.message == "Timeout after 6s of waiting for RPC response from GPU1 GSP!"
    assert ev.line == line.rstrip("\n") and ev.action == RESET_GPU


def test_parse_syslog_prefix_unknown_pid_no_pci_word_and_bytes():
    ev = parse_xid_line("Jan  2 03:04:05 gpu071 kernel: [   88.000001] NVRM: Xid "
                        "(PCI:0000:AF:00): 31, pid='<unknown>', name=<unknown>, Ch 00000008, "
                        "intr 00000000. MMU Fault")
    assert (ev.code, ev.pci, ev.pid, ev.timestamp) == (31, "0000:af:00", None, 88.000001)
    assert ev.message.startswith("Ch 00000008")
    ev = parse_xid_line("NVRM: Xid (0000:3b:00): 43, Ch 00000010")
    assert (ev.code, ev.pci, ev.pid, ev.message) == (43, "0000:3b:00", None, "Ch 00000010")
    ev = parse_xid_line(b"[Mon Jan  1 12:00:00 2024] NVRM: Xid (PCI:0000:3b:00): 94, pid=7, x")
    assert (ev.code, ev.pid, ev.timestamp) == (94, 7, None)


@pytest.mark.parametrize("line", [
    "",
    "[ 12.3] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
    "NVRM: GPU at PCI:0000:3b:00: GPU-1234-abcd",
    "kernel: eth0: link up",
    "the word Xid alone is not an NVRM line",
])
def test_non_xid_lines_are_none(line):
    assert parse_xid_line(line) is None


@pytest.mark.parametrize("line", [
    "NVRM: Xid (PCI:0000:3b:00): abc, pid=1, oops",
    "NVRM: Xid (PCI:0000:3b:00):",
    "[ 5.0] NVRM: Xid: 79, pid=1, no address",
    "NVRM: Xid (PCI:0000:3b:00): 79 pid=1 missing comma",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=abc, bad pid",
    "nvrm: xid (pci:0000:3b:00): 79, pid=1, lower case",
])
def test_malformed_xid_lines_raise_naming_the_line(line):
    with pytest.raises(XidParseError) as ei:
        parse_xid_line(line)
    msg = str(ei.value)
    assert repr(line) in msg and "\n" not in msg


def test_non_text_line_raises():
    with pytest.raises(XidParseError, match="12"):
        parse_xid_line(12)


def test_long_malformed_line_is_shortened_in_the_message():
    line = "NVRM: Xid (PCI:0000:3b:00): bad " + "x" * 1000
    msg = str(pytest.raises(XidParseError, parse_xid_line, line).value)
    assert line[:150] in msg and len(msg) < 400


def test_scan_reports_malformed_lines_without_raising():
    log = [
        "[ 1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
        "[ 2.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "[ 2.6] NVRM: Xid (PCI:0000:3b:00): garbled",
        "usb 1-1: new device",
        b"[ 3.0] NVRM: Xid (PCI:0000:18:00): 145, pid=2, NVLink RLW\n",
        "[ 3.1] NVRM: Xid (PCI",
    ]
    events, malformed = scan(log)
    assert [(e.code, e.timestamp) for e in events] == [(79, 2.5), (145, 3.0)]
    assert [(m.lineno, m.line) for m in malformed] == [
        (3, "[ 2.6] NVRM: Xid (PCI:0000:3b:00): garbled"), (6, "[ 3.1] NVRM: Xid (PCI")]
    assert all("malformed XID line" in m.error for m in malformed)
    assert scan([]) == ([], [])
    assert scan(iter(["NVRM: Xid (PCI:0000:01:00): 13, pid=3, x"])).events[0].action == INVESTIGATE
