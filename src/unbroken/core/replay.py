"""Finding silent data corruption: the cheap redundant check and the dual-phase replay.

Why two tools
-------------
Silent data corruption (SDC) makes a machine return wrong numbers without an error. Self-tests
catch only part of it (NVIDIA EUD: ~70 % recall, byterobust.md §4), so detection has to come from
the training itself, and localisation from replaying it.

* **Detect cheaply, with SPARe's redundancy.** Every shard type lives on r groups, and at stack
  depth 1 only one of them computes it. Now and then ``redundant_check_pairs`` picks a few types
  and a second host for each; both compute the type's gradient on the same data and parameters
  and compare it bit for bit. Equal bits: nothing to see. A mismatch says one of the two
  machines corrupts — but not which — and starts the replay (``core.ladder``: ``SDC`` faults
  enter at ``REPLAY``). This check is ours: ByteRobust has no redundancy to exploit.
* **Localise in two rounds: dual-phase replay** (byterobust.md §5, Algorithm 1). The M = PP x DP
  machines x_0..x_{M-1} are split twice into n = DP / k groups of m = k·PP machines: contiguous
  (H_j = {x_i : i // m == j}) and strided (V_j = {x_i : i mod n == j}). Each group replays the
  same steps from the same checkpoint as a k-replica job (TP and PP kept, DP shrunk); a group
  whose result differs from the reference failed. Because m <= n, the m consecutive indices of an
  H-group have distinct residues mod n, so an H-group and a V-group share at most one machine: a
  single culprit that reproduces is pinned down exactly, after two rounds, at any scale.

Choices made here
-----------------
* A replay group is a freshly launched job, so its m machines may take any PP stage; only the
  group size matters. That is why the strided groups are valid jobs even though they do not
  consist of whole original pipelines (the summary of Algorithm 1 leaves the layout open [I]).
* More than one culprit: the suspects are every H ∩ V intersection of two failed groups — a
  superset of the culprits (no false negatives when every culprit reproduces), reported as not
  exact when it holds more machines than the larger count of failed groups per phase.
* A mismatch in phase 1 but none in phase 2 (the SDC did not reproduce the second time): the
  machines of the failed H-groups are returned as suspects, not exact — ByteRobust's "isolate
  quickly rather than locate precisely" (§1). No mismatch in phase 1: no culprit, and no phase 2.
* The redundant check covers types in a seeded random order, k per step, so every type is
  checked within ceil(N / k) steps; host a is the live host that holds the type highest in its
  stack (it computes the type anyway), host b a seeded random other live host.

Pure: no I/O, no clock, no torch; the caller runs the replays and feeds back which failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np

__all__ = [
    "ReplayError",
    "ReplayLayout",
    "Round",
    "Verdict",
    "feasible_k",
    "horizontal_groups",
    "vertical_groups",
    "next_round",
    "redundant_check_pairs",
    "rounds_promised",
    "digest_mismatches",
    "majority_culprits",
    "sdc_check_due",
    "verified_checkpoint",
    "restore_target",
]

HORIZONTAL, VERTICAL = "horizontal", "vertical"


class ReplayError(ValueError):
    """A layout, round result or check request that cannot be used; names the bad value."""


def _int(name: str, v: object, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise ReplayError(f"{name}={v!r} must be an integer >= {low}")
    return int(v)


def feasible_k(pp: int, dp: int) -> list[int]:
    """Replicas per replay group that Algorithm 1 accepts: k divides DP and k·PP <= DP / k."""
    pp, dp = _int("pp", pp, 1), _int("dp", dp, 1)
    return [k for k in range(1, dp + 1) if dp % k == 0 and k * pp <= dp // k]


@dataclass(frozen=True)
class ReplayLayout:
    """M = pp·dp machines, replayed in groups of k data-parallel replicas (m = k·pp machines)."""

    pp: int
    dp: int
    k: int = 1

    def __post_init__(self) -> None:
        pp, dp, k = _int("pp", self.pp, 1), _int("dp", self.dp, 1), _int("k", self.k, 1)
        if dp % k:
            raise ReplayError(f"k={k} does not divide dp={dp}")
        if k * pp > dp // k:
            ok = feasible_k(pp, dp)
            raise ReplayError(f"dual-phase replay needs k*pp <= dp/k, got k={k}, pp={pp}, dp={dp}"
                              f" ({'feasible k: ' + str(ok) if ok else 'dp must be >= pp'})")

    @property
    def machines(self) -> int:
        return self.pp * self.dp

    @property
    def size(self) -> int:
        """m: machines per replay group."""
        return self.k * self.pp

    @property
    def count(self) -> int:
        """n: replay groups per phase."""
        return self.dp // self.k


def horizontal_groups(layout: ReplayLayout) -> tuple[tuple[int, ...], ...]:
    """H_j = {i : i // m == j}: contiguous blocks of m machines."""
    m, n = layout.size, layout.count
    return tuple(tuple(range(j * m, (j + 1) * m)) for j in range(n))


def vertical_groups(layout: ReplayLayout) -> tuple[tuple[int, ...], ...]:
    """V_j = {i : i mod n == j}: strided, m machines each."""
    n = layout.count
    return tuple(tuple(range(j, layout.machines, n)) for j in range(n))


@dataclass(frozen=True)
class Round:
    """Replay these groups now (all at once: together they use every machine once)."""

    phase: str
    subsets: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Verdict:
    """The replay is over: these machines are the culprits (suspects when not ``exact``)."""

    culprits: tuple[int, ...]
    exact: bool


def _check_results(name: str, res: Sequence[bool], n: int) -> tuple[bool, ...]:
    res = tuple(res)
    if len(res) != n:
        raise ReplayError(f"{name} round has {len(res)} results, expected {n} (one per group)")
    for v in res:
        if not isinstance(v, (bool, np.bool_)):
            raise ReplayError(f"{name} round result {v!r} is not a bool (True = mismatch)")
    return tuple(bool(v) for v in res)


def next_round(layout: ReplayLayout, results: Sequence[Sequence[bool]] = (),
               ) -> tuple[Round | Verdict, str]:
    """The next step of the dual-phase replay, given the rounds done so far.

    Args:
        layout: the machines and the group size.
        results: one entry per finished round, in order; each a bool per group of that round's
            ``Round.subsets`` (True: the group's result mismatched the reference).

    Returns:
        (Round, reason) while groups remain to replay, then (Verdict, reason). At most two
        rounds are ever asked for.

    Raises:
        ReplayError: more than two rounds, or a round with the wrong number of results.
    """
    if not isinstance(layout, ReplayLayout):
        raise ReplayError(f"layout {layout!r} is not a replay.ReplayLayout")
    results = list(results)
    n, m = layout.count, layout.size
    if len(results) > 2:
        raise ReplayError(f"{len(results)} rounds given; dual-phase replay has two")
    if not results:
        return Round(HORIZONTAL, horizontal_groups(layout)), (
            f"phase 1: replay {n} contiguous groups of {m} machines")
    bad_h = [j for j, bad in enumerate(_check_results(HORIZONTAL, results[0], n)) if bad]
    if not bad_h:
        if len(results) == 2:
            raise ReplayError("a second round was run although phase 1 found no mismatch")
        return Verdict((), True), "phase 1: no group mismatched; the corruption did not reproduce"
    if len(results) == 1:
        return Round(VERTICAL, vertical_groups(layout)), (
            f"phase 2: replay {n} strided groups of {m} machines "
            f"(phase 1 mismatch in {len(bad_h)} group(s) {bad_h})")
    bad_v = [j for j, bad in enumerate(_check_results(VERTICAL, results[1], n)) if bad]
    hs = horizontal_groups(layout)
    if not bad_v:
        suspects = tuple(sorted(i for j in bad_h for i in hs[j]))
        return Verdict(suspects, False), (
            f"phase 2 did not reproduce the mismatch: suspect all {len(suspects)} machines of "
            f"contiguous group(s) {bad_h}")
    # x_i lies in H_{i // m} and V_{i mod n}
    culprits = tuple(sorted(i for j in bad_h for i in hs[j] if i % n in set(bad_v)))
    exact = 0 < len(culprits) <= max(len(bad_h), len(bad_v))
    if not culprits:
        suspects = tuple(sorted(i for j in bad_h for i in hs[j]))
        return Verdict(suspects, False), (
            f"failed groups do not intersect (contiguous {bad_h}, strided {bad_v}): "
            f"suspect all {len(suspects)} machines of the contiguous ones")
    kind = "culprit(s)" if exact else "suspects (several culprits: a superset)"
    return Verdict(culprits, exact), (
        f"{kind} {list(culprits)}: contiguous {bad_h} x strided {bad_v}")


def redundant_check_pairs(layout_stacks: np.ndarray, step: int, seed: int, k: int = 1,
                          live: Sequence[bool] | np.ndarray | None = None,
                          ) -> list[tuple[int, int, int]]:
    """Which shard types to compute twice at ``step``, and on which two hosts.

    Args:
        layout_stacks: (N, r) array, row w = the shard types group w holds (top first), as in
            ``core.placement.Layout.stacks`` or the current stacks from ``core.rectlr``.
        step: the training step (>= 0).
        seed: fixes the order in which types are visited and the second hosts.
        k: types to check per step (1 <= k <= N).
        live: optional (N,) bool mask; dead groups are never chosen.

    Returns:
        k triples (shard type, host a, host b), a != b, both holding the type. Types are visited
        in a seeded permutation, k per step, so every type is checked within ceil(N / k) steps;
        a type with fewer than two live hosts is skipped that step (fewer triples come back).
    """
    stacks = np.asarray(layout_stacks)
    if stacks.ndim != 2 or stacks.shape[0] < 1 or not np.issubdtype(stacks.dtype, np.integer):
        raise ReplayError(f"layout stacks must be an (N, r) integer array, got shape "
                          f"{stacks.shape} dtype {stacks.dtype}")
    n_groups, r = stacks.shape
    if r < 2:
        raise ReplayError(f"redundancy r={r}: a redundant check needs two hosts per type")
    if stacks.min() < 0 or stacks.max() >= n_groups:
        raise ReplayError(f"layout stacks hold type ids outside [0, {n_groups})")
    step = _int("step", step, 0)
    seed = _int("seed", seed, 0)
    k = _int("k", k, 1)
    if k > n_groups:
        raise ReplayError(f"k={k} exceeds the {n_groups} shard types")
    alive = np.ones(n_groups, dtype=bool) if live is None else np.asarray(live, dtype=bool)
    if alive.shape != (n_groups,):
        raise ReplayError(f"live mask has shape {alive.shape}, expected ({n_groups},)")
    order = np.random.default_rng([seed, 0]).permutation(n_groups)
    start = (step * k) % n_groups
    out: list[tuple[int, int, int]] = []
    for i in range(k):
        t = int(order[(start + i) % n_groups])
        rows, pos = np.nonzero(stacks == t)
        keep = alive[rows]
        rows, pos = rows[keep], pos[keep]
        if len(rows) < 2:
            continue
        by_pos = np.lexsort((rows, pos))
        a = int(rows[by_pos[0]])
        others = sorted(int(w) for w in rows if int(w) != a)
        rng = np.random.default_rng([seed, 1, step, t])
        b = others[int(rng.integers(len(others)))]
        out.append((t, a, b))
    return out


def rounds_promised() -> int:
    """Dual-phase replay finishes in at most this many replay rounds, at any scale (§5)."""
    return 2



def digest_mismatches(digests: dict[int, dict[int, int]]) -> dict[int, dict[int, int]]:
    """The shard types whose hosts computed different bits: ``{type: {host: digest}}`` in,
    the entries with more than one distinct digest out (hosts that did not compute a type are
    simply absent)."""
    return {int(t): dict(ds) for t, ds in sorted(digests.items()) if len(set(ds.values())) > 1}


def majority_culprits(digests: dict[int, dict[int, int]]) -> tuple[tuple[int, ...], str]:
    """The machines whose replayed digest differs from the strict majority of the others'
    for some type (every machine recomputed the suspect types on the same parameters and
    data). A type with no strict majority names nobody: the replay is then inconclusive for
    it (ByteRobust's "isolate quickly rather than locate precisely" falls to a restart)."""
    culprits: set[int] = set()
    notes = []
    for t, ds in sorted(digests.items()):
        if not ds:
            continue
        counts: dict[int, int] = {}
        for d in ds.values():
            counts[d] = counts.get(d, 0) + 1
        top, n = max(counts.items(), key=lambda kv: kv[1])
        if 2 * n <= len(ds):
            notes.append(f"type {t}: no majority among {len(ds)}")
            continue
        odd = sorted(w for w, d in ds.items() if d != top)
        culprits.update(odd)
        notes.append(f"type {t}: {n}/{len(ds)} agree" + (f", {odd} differ" if odd else ""))
    names = tuple(sorted(culprits))
    return names, "; ".join(notes) + (f" -> culprit {list(names)}" if names else
                                      " -> no culprit")


def sdc_check_due(step: int, every: int) -> bool:
    """Whether ``step`` runs the bitwise check: the last step of every ``every`` (0: never).

    With ``every`` equal to the checkpoint interval the checkpoint written right after a check
    holds a state whose newest gradients were compared bit for bit, which is what makes it a
    roll-back target after a later mismatch (``verified_checkpoint``).
    """
    return every > 0 and (step + 1) % every == 0


def verified_checkpoint(check_step: int, ckpt_every: int) -> int | None:
    """The checkpoint step a passing check at ``check_step`` verifies, if one is written there.

    A machine that corrupts keeps corrupting (the model of this check), so a pass at step k
    means no step up to k was corrupted: the checkpoint of the state after k is clean.
    """
    return check_step + 1 if (check_step + 1) % ckpt_every == 0 else None


def restore_target(verified: int | None, committed: int, ckpt_every: int,
                   saved: Collection[int] | None = None) -> int:
    """Where to roll back to: the newest verified checkpoint, else the newest one written
    (``committed`` = newest committed step), else the seeded start (0). ``saved``: the steps
    whose checkpoints are known to be on disk; then the newest of them at or before that step
    (an older one is clean too), else 0: a save whose writer was killed never lands, and the
    members would wait for it in vain (the soak: rank 0, a straggler, evicted while it wrote
    step 20's)."""
    target = verified if verified else max(0, (committed + 1) // ckpt_every * ckpt_every)
    if saved is None:
        return target
    return max((s for s in saved if s <= target), default=0)
