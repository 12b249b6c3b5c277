"""Decisions about the job's durable coordination state: which store, who may act, who may commit.

Why pure: the same three questions are asked by the supervisor, its standby and the workers,
against etcd or the embedded TCPStore, and each answer must be testable without a cluster.
Each function takes what was read from the store (plain data) and returns
``(decision, reason)``; the reason doubles as the log line. The side effects (reading etcd,
the transactions that make a decision stick) are ``unbroken.coord``'s.

* :func:`parse_store` -- ``--store``: ``tcp`` (the embedded TCPStore, one machine, the default)
  or ``etcd://HOST:PORT[,HOST:PORT...]``; anything else is a one-line ``ValueError``.
* :func:`may_act` -- a supervisor acts only while the leader key is its own (same holder, same
  creation revision: a key re-created after an expiry is somebody else's lease even under the
  same name). Both supervisors alive is the split-brain case: only the holder gets True.
* :func:`takeover` -- what a standby does when it looks: wait (a live leader, or no job yet),
  stop (the job finished), or take over (the job runs and nobody holds the lease).
* :func:`may_commit` -- generation fencing: a committed-step watermark is accepted only from
  the current generation and only forwards. A worker cut off from etcd while the others
  re-formed holds an old generation and can never commit into the new one.
* :func:`same_job` -- a cluster's key prefix that holds another job is refused, not reused.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StoreURL", "parse_store", "may_act", "takeover", "may_commit", "same_job",
           "job_prefix", "check_job_name", "Adoption", "adoption"]


@dataclass(frozen=True)
class StoreURL:
    kind: str  # "tcp" | "etcd"
    endpoints: tuple[str, ...] = ()


def parse_store(text: str) -> StoreURL:
    """``--store``'s value; ``ValueError`` with one line naming it when it is not one."""
    t = str(text).strip()
    if t in ("", "tcp"):
        return StoreURL("tcp")
    scheme, sep, rest = t.partition("://")
    if not sep or scheme != "etcd":
        raise ValueError(f"--store {text!r}: expected 'tcp' or etcd://HOST:PORT[,HOST:PORT...]")
    eps = []
    for part in rest.rstrip("/").split(","):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--store {text!r}: {part!r} is not HOST:PORT")
        eps.append(f"{host}:{int(port)}")
    return StoreURL("etcd", tuple(eps))


def check_job_name(name: str) -> str:
    """A job name is one key segment: letters, digits, ``-``, ``_`` and ``.``."""
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"--job {name!r}: use letters, digits, '-', '_' or '.'")
    return name


def job_prefix(job: str) -> str:
    """Every key of job ``job`` lives under this prefix (one job per prefix)."""
    return f"/unbroken/{job}/"


def may_act(leader: tuple[str, int] | None, me: str, my_revision: int) -> tuple[bool, str]:
    """``leader``: (holder, creation revision) of the leader key as read, None if absent."""
    if leader is None:
        return False, f"{me}: nobody holds the lease (expired): not acting"
    holder, rev = leader
    if holder == me and rev == my_revision:
        return True, f"{me} holds the lease (revision {rev})"
    return False, f"{me}: the lease is {holder}'s (revision {rev}): not acting"


def takeover(leader: str | None, job_status: str | None) -> tuple[str, str]:
    """A standby's move: ``("wait" | "stop" | "take", reason)``. ``job_status``: the job's
    durable status (None: no job under the prefix yet, "running", "done")."""
    if job_status == "done":
        return "stop", "the job finished: nothing to take over"
    if leader is not None:
        return "wait", f"supervisor {leader} holds the lease"
    if job_status is None:
        return "wait", "no job under this prefix yet"
    return "take", "the job is running and its supervisor's lease expired: taking over"


def may_commit(worker_generation: int, current_generation: int, step: int,
               committed: int) -> tuple[bool, str]:
    """Whether a watermark ``step`` from a worker of ``worker_generation`` may be recorded."""
    if worker_generation != current_generation:
        return False, (f"generation {worker_generation} is fenced: the job is at generation "
                       f"{current_generation}; step {step} not committed")
    if step <= committed:
        return False, f"step {step} is not past the committed step {committed}"
    return True, f"step {step} committed in generation {current_generation}"


def same_job(stored: dict | None, mine: dict) -> tuple[bool, str]:
    """Whether the job recorded under a prefix (None: none) is this one (same identity)."""
    if stored is None:
        return True, "the prefix is free"
    diff = sorted(k for k in set(stored) | set(mine) if stored.get(k) != mine.get(k))
    if not diff:
        return True, "the prefix holds this job"
    k = diff[0]
    return False, (f"the prefix holds another job ({k}: {stored.get(k)!r}, this run: "
                   f"{mine.get(k)!r}); pass another --job")


@dataclass(frozen=True)
class Adoption:
    """What a standby adopts of a running job (``adoption``): the members, their slots, the
    job's next step (every member committed the one before, or is one commit behind it:
    ``behind``), the generation, and the members that did not report (lost: their slots are
    masked and refilled as after a death)."""

    members: tuple[int, ...]
    slot_of: dict
    step: int
    gen: int
    missing: tuple[int, ...]
    behind: tuple[int, ...] = ()


def adoption(reports: dict[int, dict], final: bool) -> tuple[Adoption | None, str]:
    """A standby's decision on the members' re-attach reports (``runtime.reattach.report``:
    uid -> {step, gen, members, slot_of}, and ``steps``: every rank's, for a group of
    several). ``final``: its wait is over (no more will come).

    The members of the newest generation reported are the job's. They stopped after a
    committed step (the step buffer's agreement) -- or, when a peer died mid-all-reduce as
    the coordinator went, some saw that step's op complete and committed it while the others
    saw it fail: those are one commit behind (``behind``). The standby's first settle rolls
    them forward with a committer's reduced buffer (``runtime.recovery``), as after any op
    that completed on some members only. Two steps apart cannot come from one generation's
    op: nothing is adopted (restart from the checkpoint). Until ``final``, a member missing is
    waited for; then it is adopted as lost."""
    if not reports:
        return None, "no member re-attached" + ("" if final else " yet")
    gen = max(int(r["gen"]) for r in reports.values())
    newest = [r for r in reports.values() if int(r["gen"]) == gen]
    members = tuple(sorted(int(m) for m in newest[0]["members"]))
    at = {u: {int(x) for x in r.get("steps", [r["step"]])}
          for u, r in reports.items() if u in members}
    steps = set().union(*at.values()) if at else set()
    split = sorted(u for u, v in at.items() if len(v) > 1)
    if split:  # its ranks commit together (the group's agreement): not a boundary of its own
        return None, (f"the ranks of group {split[0]} stopped at steps {sorted(at[split[0]])}: "
                      f"no common boundary to adopt; restart from the checkpoint")
    if steps and max(steps) - min(steps) > 1:
        return None, (f"the members stopped at steps {sorted(steps)}: more than one commit "
                      f"apart, no common boundary to adopt; restart from the checkpoint")
    missing = tuple(m for m in members if m not in reports)
    if missing and not final:
        return None, f"waiting for members {list(missing)} to re-attach"
    if len(missing) == len(members):
        return None, "no member of the newest generation re-attached"
    top = max(steps)
    behind = tuple(sorted(u for u, v in at.items() if min(v) < top))
    slot_of = {int(u): int(s) for u, s in newest[0]["slot_of"].items() if int(u) in members}
    why = (f"adopting generation {gen}: members {list(members)} after step {top - 1}"
           + (f"; {list(behind)} one commit behind: rolled forward" if behind else "")
           + (f"; {list(missing)} never re-attached: lost" if missing else ""))
    return Adoption(members, slot_of, top, gen, missing, behind), why
