"""Every journal event the package emits or reads by name is a member of ``unbroken.events.Event``
(read from the source tree), and the members are the strings on disk."""

from __future__ import annotations

import json
import re
from pathlib import Path

from unbroken.supervise.outdir import read_journal
from unbroken.events import Event

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [*(ROOT / "src" / "unbroken").rglob("*.py"), ROOT / "bench" / "chaos.py"]


def test_no_event_name_is_a_literal_and_every_member_exists():
    literal, used = [], set()
    for f in SOURCES:
        text = f.read_text()
        for m in re.finditer(r'"event"\s*:\s*"([a-z_]+)"', text):
            if "``" not in text[max(0, m.start() - 60):m.start()]:  # prose in a docstring
                literal.append(f"{f.name}: {m.group(0)}")
        used |= set(re.findall(r"\bEvent\.([A-Z_]+)\b", text))
    assert not literal, literal
    assert used <= set(Event.__members__), used - set(Event.__members__)


def test_members_serialise_as_their_strings():
    for e in Event:
        assert e == e.value and json.dumps({"event": e}) == '{"event": "%s"}' % e.value
        assert e.name.lower() == e.value


def test_a_journal_on_disk_has_only_known_events():
    evs = read_journal(ROOT / "tests" / "data" / "chaos11_trimmed.jsonl")
    assert evs and {e["event"] for e in evs} <= {e.value for e in Event}
