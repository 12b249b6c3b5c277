"""OpenMetrics text with timestamps: the files ``promtool tsdb create-blocks-from openmetrics``
backfills, read into a Frame and written from one.

Why our own reader: the reader in ``prometheus_client`` parses exposition text into objects per
sample (slow for millions of lines) and stops at the first bad line; an operator's export has
a torn line now and then and the analysis must still run on the rest. So: one pass over the
lines, the label set parsed once per distinct series, bad lines kept with their line numbers
(reported as warnings, up to a cap), plain or gzip (by the magic bytes, not the name).

Only the metrics in ``learn.names`` are kept; series are reduced to (metric, node, key label)
and collisions are summed for counters, averaged for gauges.
"""

from __future__ import annotations

import gzip
import warnings as warnings_mod
import os
import re
from itertools import islice

import numpy as np

from unbroken.learn import names
from unbroken.learn.frame import Frame, build_frame, reduce_labels

__all__ = ["read_openmetrics", "write_openmetrics", "OpenMetricsError", "parse_lines",
           "merge_series"]

MAX_WARNINGS = 20
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


class OpenMetricsError(ValueError):
    """Nothing readable in the input (the message names the file)."""


def _open_text(path: str):
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def _labels(text: str) -> dict[str, str] | None:
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            return None
        out[m.group(1)] = m.group(2)
        pos = m.end()
    return out


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}\n]*\})?)[ \t]+(\S+)[ \t]+(\S+)[ \t]*$",
                     re.M)
_COMMENT = re.compile(r"^#.*\n?", re.M)


def _floats(tokens: list[str], n: int) -> np.ndarray:
    """Numbers parsed in C (``np.fromstring`` with a separator); ValueError when one is not."""
    with warnings_mod.catch_warnings():
        warnings_mod.simplefilter("error", DeprecationWarning)
        try:
            out = np.fromstring(" ".join(tokens), sep=" ")
        except DeprecationWarning:
            raise ValueError("not a number") from None
    if len(out) != n:
        raise ValueError("not a number")
    return out


class _Parser:
    """State of one pass: series seen, samples gathered, malformed lines reported."""

    def __init__(self, source: str, wanted, warnings: list[str]) -> None:
        self.source, self.wanted, self.warnings = source, wanted, warnings
        self.seen: dict[str, tuple | None] = {}
        self.acc: dict[tuple, tuple[list, list]] = {}
        self.bad = 0

    def key(self, head: str):
        key = self.seen.get(head, False)
        if key is False:
            name, _, lab = head.partition("{")
            if name not in self.wanted:
                key = None
            else:
                labels = _labels(lab[:-1]) if lab else {}
                if labels is None:
                    raise ValueError("bad label set")
                red = reduce_labels(name, labels)
                if red is None:
                    raise ValueError("no instance label")
                key = (name, red[0], red[1], head)
            self.seen[head] = key
        return key

    def add(self, key, ts, vs) -> None:
        lst = self.acc.get(key)
        if lst is None:
            lst = self.acc[key] = ([], [])
        lst[0].append(np.asarray(ts, float))
        lst[1].append(np.asarray(vs, float))

    def malformed(self, lineno: int, line: str, why: str) -> None:
        self.bad += 1
        if self.bad <= MAX_WARNINGS:
            self.warnings.append(f"{self.source}:{lineno}: malformed OpenMetrics line skipped "
                                 f"({why}): {line.strip()[:120]!r}")

    def block_fast(self, text: str) -> bool:
        """All data lines of ``text`` at once, False when some line is not plain
        ``head value timestamp`` (the caller then goes line by line for the line numbers).

        Why not a regex per line: at millions of lines the per-line Python work is the cost.
        Here ``str.split`` cuts the block into tokens in C, a block of n sample lines is then
        exactly 3n tokens, numpy converts the value and timestamp columns, and the series are
        the runs of equal heads (a family's samples are contiguous per series)."""
        if "#" in text:
            text = _COMMENT.sub("", text)
        toks = text.split()
        n = len(toks) // 3
        if len(toks) != 3 * text.count("\n") or not toks:
            return not toks and not text.strip()   # (a blank line: line by line)
        heads = np.array(toks[0::3], dtype=object)
        vs = _floats(toks[1::3], n)
        ts = _floats(toks[2::3], n)
        cut = np.flatnonzero(heads[1:] != heads[:-1]) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [len(heads)]])
        batch = []
        for a, b in zip(starts.tolist(), ends.tolist()):
            key = self.key(heads[a])      # ValueError on a bad label set -> line by line
            if key is not None:
                batch.append((key, a, b))
        for key, a, b in batch:
            self.add(key, ts[a:b], vs[a:b])
        return True

    def line(self, lineno: int, line: str) -> None:
        if not line.strip() or line[0] == "#":
            return
        m = _SAMPLE.match(line.rstrip("\r\n"))
        if m is None:
            parts = line.split()
            why = ("no timestamp" if len(parts) == 2 else "no value" if len(parts) == 1
                   else "expected 'name{labels} value timestamp'")
            self.malformed(lineno, line, why)
            return
        head, v, ts = m.groups()
        try:
            key = self.key(head)
            if key is None:
                return
            self.add(key, [float(ts)], [float(v)])
        except ValueError as e:
            self.malformed(lineno, line, str(e))


def _blocks(src):
    """Text blocks that end at a line end: big reads from a file, joined lines from a list."""
    if hasattr(src, "read"):
        rest = ""
        while True:
            chunk = src.read(1 << 23)
            if not chunk:
                break
            chunk = rest + chunk
            cut = chunk.rfind("\n") + 1
            if cut == 0:
                rest = chunk
                continue
            yield chunk[:cut]
            rest = chunk[cut:]
        if rest:
            yield rest + "\n"
        return
    it = iter(src)
    while True:
        block = list(islice(it, 200_000))
        if not block:
            return
        yield "".join(ln if ln.endswith("\n") else ln + "\n" for ln in block)


def parse_lines(src, source: str = "<input>", wanted=frozenset(names.ALL),
                warnings: list[str] | None = None) -> dict:
    """(metric, node, label) -> (timestamps, values) from OpenMetrics text (an open text file
    or a list of lines). Malformed lines are skipped and reported in ``warnings`` with their
    line numbers."""
    warnings = [] if warnings is None else warnings
    p = _Parser(source, wanted, warnings)
    lineno = 0
    for text in _blocks(src):
        try:
            ok = p.block_fast(text)
        except ValueError:
            ok = False
        lines = text.split("\n")[:-1]
        if not ok:
            for i, ln in enumerate(lines, lineno + 1):
                p.line(i, ln)
        lineno += len(lines)
    if p.bad > MAX_WARNINGS:
        warnings.append(f"{source}: {p.bad - MAX_WARNINGS} more malformed lines skipped")
    acc = {k: (np.concatenate(v[0]), np.concatenate(v[1])) for k, v in p.acc.items()}
    return merge_series(acc)


def merge_series(acc: dict) -> dict:
    """Series that reduce to one (metric, node, label): summed (counters) or averaged."""
    groups: dict[tuple, list] = {}
    for (name, node, lab, _head), (ts, vs) in acc.items():
        groups.setdefault((name, node, lab), []).append((np.asarray(ts), np.asarray(vs)))
    out = {}
    for key, parts in groups.items():
        if len(parts) == 1:
            out[key] = parts[0]
            continue
        ts = np.unique(np.concatenate([p[0] for p in parts]))
        stack = np.stack([np.interp(ts, p[0], p[1], left=np.nan, right=np.nan) for p in parts])
        out[key] = (ts, np.nansum(stack, 0) if key[0] in names.COUNTERS
                    else np.nanmean(stack, 0))
    return out


def read_openmetrics(paths: list[str], start: float | None = None,
                     end: float | None = None) -> Frame:
    warnings: list[str] = []
    samples: dict = {}
    for p in paths:
        try:
            fh = _open_text(p)
        except OSError as e:
            raise OpenMetricsError(f"--openmetrics {p}: {e.strerror or e}") from None
        try:
            with fh:
                got = parse_lines(fh, source=os.path.basename(p), warnings=warnings)
        except (OSError, EOFError) as e:
            raise OpenMetricsError(f"--openmetrics {p}: unreadable ({e})") from None
        for k, v in got.items():
            if k in samples:
                ts = np.concatenate([samples[k][0], v[0]])
                vs = np.concatenate([samples[k][1], v[1]])
                o = np.argsort(ts, kind="stable")
                samples[k] = (ts[o], vs[o])
            else:
                samples[k] = v
    if not samples:
        raise OpenMetricsError(f"--openmetrics {', '.join(paths)}: no samples of the known "
                               f"metrics (node_exporter / dcgm-exporter names, with an instance "
                               f"label and a timestamp)")
    frame = build_frame(samples, start=start, end=end)
    frame.warnings.extend(warnings)
    return frame


def _fmt_labels(node: str, label_name: str, label: str) -> str:
    if label_name:
        return f'{{instance="{node}",{label_name}="{label}"}}'
    return f'{{instance="{node}"}}'


def write_openmetrics(frame: Frame, path: str | os.PathLike) -> None:
    """The frame as OpenMetrics text (gzip when ``path`` ends in .gz), ``# EOF`` last.

    One metric family at a time, each series' samples in time order (what promtool's backfill
    expects); absent (NaN) samples are left out; timestamps in seconds.
    """
    path = os.fspath(path)
    fh = gzip.open(path, "wt", compresslevel=1) if path.endswith(".gz") else open(path, "w")
    ts = [f"{x:.0f}" if float(x).is_integer() else f"{x:.3f}" for x in frame.t.tolist()]
    with fh:
        by_name: dict[str, list[str]] = {}
        for (name, lab) in frame.series:
            by_name.setdefault(name, []).append(lab)
        for name in sorted(by_name):
            kind = "gauge" if name not in names.COUNTERS else "unknown"
            fh.write(f"# TYPE {name} {kind}\n")
            ln = names.key_label(name)
            fmt = "{:.12g}" if name in names.COUNTERS else "{:.6g}"
            for lab in sorted(by_name[name]):
                arr = frame.series[(name, lab)]
                for i, node in enumerate(frame.nodes):
                    head = name + _fmt_labels(node, ln, lab) + " "
                    row = arr[i]
                    ok = np.flatnonzero(np.isfinite(row))
                    vals = row[ok].tolist()
                    fh.write("".join(f"{head}{fmt.format(v)} {ts[j]}\n"
                                     for v, j in zip(vals, ok.tolist())))
        fh.write("# EOF\n")
