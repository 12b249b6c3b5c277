"""Hang localisation by stack aggregation: the majority is healthy, the rest is over-evicted.

Why: a hang gives no error to read. Every rank just waits, and a plain collective timeout says
only that the job is stuck (~10 min), not where (byterobust.md §3). ByteRobust's Runtime
Analyzer (byterobust.md §6) dumps the Python stack of every worker (py-spy), clusters the
stacks by exact text, takes the dominant cluster as healthy and calls every other worker an
outlier. Healthy ranks of a hung collective all wait at the same line; the culprit is elsewhere
(stuck in a kernel, a data loader, a different collective). It then evicts the smallest
parallel group that contains all outliers, deliberately more machines than strictly guilty
("over-eviction"), because a group is the unit the job can drop and refill from warm standby.

This module is the pure part: text in, decision out, no I/O. ``unbroken.detect.stacks`` takes
the dumps (py-spy, or faulthandler as the fallback) and calls :func:`aggregate`.

Normalisation (:func:`normalise`)
---------------------------------
Two dumps of the same code path must compare equal, so everything that differs between
processes but not between code paths is removed:

* headers (``Process 4711: ...``, ``Python v3.11.7 (...)``) are dropped;
* thread headers (py-spy ``Thread 4711 (idle): "MainThread"``, faulthandler
  ``Current thread 0x00007f... (most recent call first):``) become a bare ``thread`` line:
  thread ids, names and idle/active states go;
* a frame becomes ``function (file)``: line numbers go (two ranks a few lines apart in the
  same loop are one code path), directories go (venv paths differ between machines), and a
  py-spy ``Class.method`` becomes ``method`` so that py-spy and faulthandler dumps of the same
  process normalise to the same text (a fallback dump must not look like an outlier);
* py-spy ``--locals`` values become ``name: ?`` (tensor values, pids and counters differ on
  every rank), the name stays;
* anything else left has hex addresses replaced by ``0x?`` and digits by ``N``;
* only the main thread's block is kept when the dump names it (py-spy's ``"MainThread"``,
  faulthandler's ``Current thread``): a stall is where the training thread is, and helper
  threads (heartbeat, health agent, a state copy's waiter) sit in frames that depend on timing.
  At 16 groups they split healthy ranks into so many clusters that no majority was left
  (the 50-fault soak: every stall vote inconclusive). Without a named main thread, every
  block is kept, sorted, because thread order in a dump is not stable.

Decision (:func:`aggregate`)
----------------------------
* Clusters are groups of ranks with equal normalised text, largest first.
* **One cluster** (or one rank): ``none``, nothing to evict. Stack aggregation cannot localise
  a hang where every rank waits at the same place; the caller goes on to stop-time diagnosis.
* **A strict majority cluster** (more than half of the ranks): those ranks are healthy, every
  other rank is an outlier, and the decision is ``evict`` of the smallest group that covers
  all outliers; when that group is the whole job, ``inconclusive`` instead (an eviction of
  every rank is a restart: the ladder's business, not the localiser's).
* **No strict majority** (a tie between the two largest clusters, or all stacks different):
  ``inconclusive`` with the whole job as the suspect group. We do not guess which half is
  healthy; evicting the wrong half evicts the healthy machines and keeps the bad one. The
  caller suspends the job for stop-time diagnosis (byterobust.md §4) instead.

Groups: each rank has coordinates ``(dp, pp, tp)``. The candidate groups, in this order:

* ``dp``: one data-parallel replica, the ranks with the same ``dp`` (``pp_size * tp_size``
  ranks: all the stages and tensor shards of one model copy). It is the smallest group the
  job can lose and still run: TP and PP stay fixed, DP shrinks (the same reasoning as the
  dual-phase replay, byterobust.md §5). A lone TP group or pipeline stage of one replica
  cannot be dropped without breaking that replica, which is why it is not a candidate.
* ``pp``: one pipeline stage across all replicas, the ranks with the same ``pp``
  (``dp_size * tp_size`` ranks). Outliers in several replicas but all at one stage point at
  that stage's code or data, not at one machine.
* ``job``: every rank.

The smallest candidate (by number of ranks) that contains every outlier wins; on equal size a
``dp`` replica beats a ``pp`` stage (a replica is what elastic DP can actually drop). The
published rule also names TP groups; with TP inside a machine (the reference's layout) a TP
group is one machine of a replica, so mapping to the replica is the over-eviction the paper
describes. The coordinates keep TP and PP so the rule reads as published.

A rank whose dump failed should be passed in with a text that says so (the detect layer does
``<dump failed: ...>``): a process that cannot be inspected forms its own cluster and so is an
outlier, which is what it should be.

Limitation: the comparison is across all ranks. Pipeline stages that legitimately sit in
different code (one in a send, one in a recv) form clusters of their own; with a strict
majority required, that yields ``inconclusive`` rather than a wrong eviction.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

__all__ = [
    "StacksError",
    "Coord",
    "StackVerdict",
    "NONE",
    "EVICT",
    "INCONCLUSIVE",
    "normalise",
    "cluster",
    "covering_group",
    "aggregate",
]

NONE = "none"
EVICT = "evict"
INCONCLUSIVE = "inconclusive"


class StacksError(ValueError):
    """A dump set or coordinate map that cannot be used; the message names the bad value."""


@dataclass(frozen=True)
class Coord:
    """A rank's place in the 3-D layout: data-parallel replica, pipeline stage, tensor shard."""

    dp: int
    pp: int
    tp: int

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise StacksError(f"Coord.{name}={v!r} is not a non-negative int")


@dataclass(frozen=True)
class StackVerdict:
    """What to do. ``ranks`` is the group to evict (``evict``) or the suspects
    (``inconclusive``: the whole job); empty for ``none``. ``kind``/``index`` name the group:
    ``("dp", d)``, ``("pp", s)``, ``("job", None)``, or ``("", None)`` for ``none``.
    ``clusters`` are ``(normalised text, ranks)``, largest first."""

    action: str
    kind: str
    index: int | None
    ranks: tuple
    outliers: tuple
    healthy: tuple
    clusters: tuple


_HEADER = re.compile(r"^(Process \d+:|Python v\d)")
_THREAD = re.compile(r"^(Current thread|Thread)\b")
#: the main thread's header: py-spy names it; faulthandler's signal handler runs on the thread
#: the kernel delivered SIGUSR1 to, the main thread of a Python process that does not block it
_MAIN = re.compile(r'"MainThread"|^Current thread')
_FH_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?:\d+|\?+) in (?P<func>.+?)\s*$')
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^()]*?)(?::\d+)?\)\s*$")
_LOCALS_HEADER = re.compile(r"^\s+(Arguments|Locals):\s*$")
_LOCAL = re.compile(r"^\s+(?P<name>[A-Za-z_][\w.]*): ")
_NOISE = re.compile(r"0x[0-9a-fA-F]+|\d+")


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _scrub(text: str) -> str:
    return _NOISE.sub(lambda m: "0x?" if m[0].startswith("0x") else "N", " ".join(text.split()))


def _frame(func: str, file: str) -> str:
    func = func.strip()
    if not func.startswith("<") and not func.startswith("0x"):
        func = func.rsplit(".", 1)[-1]  # py-spy "Class.method" -> faulthandler's "method"
    return f"{_scrub(func)} ({_scrub(_basename(file))})"


def normalise(dump: str) -> str:
    """The code path of a py-spy or faulthandler dump, without per-process noise (see the
    module docstring). Pure; the result is the clustering key."""
    if not isinstance(dump, str):
        raise StacksError(f"dump={dump!r} is not a str")
    threads: list[list[str]] = []
    main: list[str] | None = None
    current: list[str] | None = None
    in_locals = False
    for raw in dump.splitlines():
        if not raw.strip() or _HEADER.match(raw):
            continue
        if _THREAD.match(raw):
            current = []
            threads.append(current)
            if main is None and _MAIN.search(raw):
                main = current
            in_locals = False
            continue
        if current is None:  # text before any thread header: keep it, scrubbed
            current = []
            threads.append(current)
        if _LOCALS_HEADER.match(raw):
            in_locals = True
            current.append(raw.strip())
            continue
        m = _FH_FRAME.match(raw)
        if m:
            in_locals = False
            current.append(_frame(m["func"], m["file"]))
            continue
        if in_locals:
            lm = _LOCAL.match(raw)
            if lm:
                current.append(f"{lm['name']}: ?")
                continue
        m = _PYSPY_FRAME.match(raw)
        if m:
            in_locals = False
            current.append(_frame(m["func"], m["file"]))
            continue
        current.append(_scrub(raw))
    if main:  # where the training thread is: helper threads (heartbeat, health agent, a copy
        #       waiting) sit in timing-dependent frames that split 16 healthy ranks into many
        #       clusters, so the majority is taken over the main thread alone
        return "thread\n" + "\n".join(main)
    blocks = sorted("thread\n" + "\n".join(t) for t in threads if t)
    return "\n".join(blocks)


def _rank_key(r: Hashable) -> tuple:
    return (type(r).__name__, r) if isinstance(r, (int, str)) else (type(r).__name__, repr(r))


def cluster(dumps: Mapping[Hashable, str]) -> tuple[tuple[str, tuple], ...]:
    """Ranks grouped by normalised dump, largest cluster first (ties: the cluster with the
    lowest rank first, so the order is deterministic)."""
    groups: dict[str, list] = {}
    for rank in sorted(dumps, key=_rank_key):
        groups.setdefault(normalise(dumps[rank]), []).append(rank)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), _rank_key(kv[1][0])))
    return tuple((text, tuple(ranks)) for text, ranks in ordered)


def _check_coords(coords: Mapping[Hashable, Coord]) -> None:
    if not coords:
        raise StacksError("coords={} is empty")
    seen: dict[Coord, Hashable] = {}
    for rank, c in coords.items():
        if not isinstance(c, Coord):
            raise StacksError(f"coords[{rank!r}]={c!r} is not a Coord")
        if c in seen:
            raise StacksError(f"coords[{rank!r}]={c} is also coords[{seen[c]!r}]")
        seen[c] = rank


def covering_group(outliers, coords: Mapping[Hashable, Coord]) -> tuple[str, int | None, tuple]:
    """The smallest candidate group (``dp`` replica, ``pp`` stage, ``job``) containing every
    outlier: ``(kind, index, ranks)``. Equal size: ``dp`` first."""
    _check_coords(coords)
    outs = list(outliers)
    if not outs:
        raise StacksError("outliers=() is empty: nothing to cover")
    for r in outs:
        if r not in coords:
            raise StacksError(f"outlier {r!r} has no coordinates")
    every = tuple(sorted(coords, key=_rank_key))
    candidates: list[tuple[int, int, str, int | None, tuple]] = []
    for order, kind in enumerate(("dp", "pp")):
        values = {getattr(coords[r], kind) for r in outs}
        if len(values) == 1:
            (v,) = values
            members = tuple(r for r in every if getattr(coords[r], kind) == v)
            candidates.append((len(members), order, kind, v, members))
    candidates.append((len(every), 2, "job", None, every))
    _, _, kind, index, members = min(candidates, key=lambda c: (c[0], c[1]))
    return kind, index, members


def aggregate(
    dumps: Mapping[Hashable, str], coords: Mapping[Hashable, Coord]
) -> tuple[StackVerdict, str]:
    """Cluster the dumps, take a strict majority as healthy, map the outliers to the smallest
    covering group. Returns ``(verdict, reason)``; see the module docstring for the rules."""
    if not dumps:
        raise StacksError("dumps={} is empty")
    _check_coords(coords)
    missing = [r for r in dumps if r not in coords]
    if missing:
        raise StacksError(f"ranks {missing!r} have dumps but no coordinates")
    extra = [r for r in coords if r not in dumps]
    if extra:
        raise StacksError(f"ranks {extra!r} have coordinates but no dump")
    clusters = cluster(dumps)
    n = len(dumps)
    every = tuple(sorted(dumps, key=_rank_key))
    if len(clusters) == 1:
        return (
            StackVerdict(NONE, "", None, (), (), every, clusters),
            f"all {n} stacks are the same code path: no outlier to localise",
        )
    top = clusters[0][1]
    if 2 * len(top) <= n:
        sizes = "+".join(str(len(r)) for _, r in clusters)
        return (
            StackVerdict(INCONCLUSIVE, "job", None, every, every, (), clusters),
            f"no strict majority among {n} stacks (clusters {sizes}): cannot tell healthy "
            f"from stuck, whole job suspect -> stop-time diagnosis",
        )
    outliers = tuple(r for r in every if r not in set(top))
    kind, index, members = covering_group(outliers, coords)
    if len(members) == n:  # dropping every rank is a restart, not an eviction: the majority
        #                    says who is healthy, but no group short of the job isolates the rest
        return (
            StackVerdict(INCONCLUSIVE, "job", None, every, outliers, top, clusters),
            f"{len(top)}/{n} stacks agree, but the outliers {list(outliers)} span several "
            f"replicas and stages: only the whole job covers them -> stop-time diagnosis",
        )
    where = "the whole job" if kind == "job" else f"{kind} group {index}"
    return (
        StackVerdict(EVICT, kind, index, members, outliers, top, clusters),
        f"{len(top)}/{n} stacks agree; outliers {list(outliers)} -> smallest covering group "
        f"is {where} ({len(members)} ranks: {list(members)})",
    )


def vote(verdicts: list[StackVerdict], need: int = 2) -> tuple[StackVerdict | None, str]:
    """Agreement over repeated dump rounds: a training loop that polls a collective is caught
    in different innermost frames from one dump to the next, so one round can be
    inconclusive; the first ``evict`` verdict that ``need`` rounds agree on (same ranks) is
    the answer. Returns (verdict or None, reason)."""
    seen: dict[tuple, int] = {}
    for v in verdicts:
        if v.action == "evict":
            seen[v.ranks] = seen.get(v.ranks, 0) + 1
            if seen[v.ranks] >= need:
                return v, (f"{seen[v.ranks]} of {len(verdicts)} dump rounds agree on evicting "
                           f"{v.kind} group {v.index} (ranks {list(v.ranks)})")
    kinds = [v.action for v in verdicts]
    return None, f"no {need} dump rounds agree on an eviction ({kinds})"
