"""Tailing a group's journal: the complete lines appended since the last read."""

from __future__ import annotations

import json
from pathlib import Path

from unbroken.events import Event

__all__ = ["JournalTail"]


class JournalTail:
    """Reads the complete lines appended to a group's journal since the last call.

    The file stays open once it exists: the loop reads every journal 20 times a second, and an
    open, seek and close per read were most of the supervisor's CPU between events (the
    journals are only ever appended to, so an open file sees what is written after it)."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.rest = path, 0, b""
        self._f = None

    def read(self) -> list[dict]:
        if self._f is None:
            try:
                self._f = open(self.path, "rb")
            except FileNotFoundError:
                return []
            self._f.seek(self.pos)
        data = self._f.read()
        self.pos += len(data)
        data, self.rest = self.rest + data, b""
        lines = data.split(b"\n")
        self.rest = lines.pop()  # an incomplete last line waits for its newline
        out = []
        for x in lines:
            if x.strip():
                try:
                    out.append(json.loads(x))
                except ValueError:  # a line a killed writer left half-written
                    out.append({"event": Event.JOURNAL_DAMAGED, "file": str(self.path)})
        return out

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

