"""The train face's commands: ``unbroken run``, its ``demo`` preset, and ``agent``.

``run`` and ``demo`` share the fault-tolerance flags (``_job_args``) and the live view (a
terminal) or one line per event (piped); bad input, the trainer included, is one line before
any process starts. A run that stops on purpose raises ``cliargs.Stopped`` carrying its
documented exit code (``protocol.ExitCode``); ``agent`` returns its own (``unbroken.nodes``).

``add_*_args(parser)`` adds a command's flags, ``run(a)`` returns plain data (what ``--json``
prints; an exit code for ``agent``), ``show(console, a, data)`` is the terminal view;
``unbroken.cli`` wires them.
"""

from __future__ import annotations

import argparse
import json
import sys

from unbroken.cliargs import (Stopped, UsageError, finite_float, integer, nonneg_int,
                              positive_float, positive_int)

__all__ = ["add_run_args", "add_demo_args", "add_agent_args", "run", "show"]


def _job_args(p: argparse.ArgumentParser, *, steps: int, out: str) -> None:
    """The options ``run`` and its ``demo`` preset share (the fault-tolerance settings)."""
    p.add_argument("--groups", type=integer, default=4, help="data-parallel groups (>= 2)")
    p.add_argument("--redundancy", type=integer, default=2, help="shard types per group r")
    p.add_argument("--steps", type=integer, default=steps)
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--faults", default=None,
                   help="a fire drill: kind:group@step,... (kill, hang, slow, stall, nan, "
                        "flip, xid[N], update@step) or 'none'; demo default: a kill, a hang "
                        "and two failures close together")
    p.add_argument("--stragglers", default=None, metavar="SPEC",
                   help="slow groups down by a trace: persistent:G@F[,persistent:G@F...] (group "
                        "G F times slower), bursty:SEED, rotating:P[@F], a CSV file of "
                        "step,group,slowdown rows, or 'none'")
    p.add_argument("--sync", default="sync", metavar="MODE",
                   help="sync mode, switchable at a step boundary: sync (default), mask (leave "
                        "a predicted-late group out like a failed one; its types go to their "
                        "other hosts: the synchronous gradient), ksync:K (commit with the K "
                        "predicted fastest groups, the others' samples deferred to later steps, "
                        "each used once), groups (STAR's dynamic groups: clusters by predicted "
                        "step time, the fastest synchronous, the others deliver stale gradients "
                        "computed in the background), async (every group its own cluster), auto "
                        "(choose sync, mask or ksync:K online by predicted time to accuracy)")
    p.add_argument("--selector", default=None, metavar="FILE",
                   help="with --sync auto: choose the mode with STAR's ML selector from this "
                        "model file (unbroken sync train-selector --runtime) instead of the "
                        "time-to-accuracy heuristic")
    p.add_argument("--target-loss", type=finite_float, default=None, metavar="L",
                   help="report the time the loss (of a whole data step) first reaches L (tta_s)")
    p.add_argument("--chaos", type=nonneg_int, default=None, metavar="SEED",
                   help="a seeded mix of every fault kind (kill, hang, slow, nan, bit flip, "
                        "XID, bad code update); implies --guard act")
    p.add_argument("--chaos-faults", type=integer, default=None, metavar="K",
                   help="with --chaos: K faults instead of one of each, slots failing again "
                        "and again (a soak)")
    p.add_argument("--spares", type=integer, default=None,
                   help="warm standby processes (default: one per scheduled fault)")
    p.add_argument("--standby-p", type=float, default=None, metavar="P",
                   help="size the warm pool as the P99 of Binomial(groups, P), P = a group's "
                        "failure probability per refill window (instead of --spares)")
    p.add_argument("--staleness", type=positive_float, default=0.3,
                   help="heartbeat silence that marks a group hung (s)")
    p.add_argument("--supervisor-staleness", type=positive_float, default=5.0,
                   help="members stop with a checkpoint (exit 5) when the supervisor has been "
                        "silent (stopped, wedged) this long (s)")
    p.add_argument("--local-nodes", type=integer, default=0, metavar="K",
                   help="run the groups under K node agents on this machine, each a process "
                        "tree of its own (unbroken.nodes; a node:I@S fault kills agent I with "
                        "everything it started); K > groups: exit 2")
    p.add_argument("--nodes", type=integer, default=0, metavar="K",
                   help="run the groups under K node agents started on other machines with "
                        "`unbroken agent --coordinator THIS_HOST:PORT` (PORT: --listen); they "
                        "outlive a restart; --out must be on a filesystem every node mounts at "
                        "the same path")
    p.add_argument("--listen", type=integer, default=0, metavar="PORT",
                   help="with --nodes: the port the agents are given (0: any free one, "
                        "printed); one that cannot be listened on: exit 2")
    p.add_argument("--node-staleness", type=positive_float, default=1.0,
                   help="with node agents: an agent silent this long (cut off) loses its node")
    p.add_argument("--ckpt-every", type=integer, default=None,
                   help="durable checkpoint every K steps (default 50, 10 with --chaos)")
    p.add_argument("--metrics-port", type=integer, default=None,
                   help="serve ETTR and fault metrics for Prometheus on this port (0: any)")
    p.add_argument("--xid-log", default=None,
                   help="kernel-log file to watch for GPU XID lines")
    p.add_argument("--guard", choices=("log", "act"), default=None,
                   help="log (default): detections and ladder decisions are journaled only; "
                        "act: the ladder's decisions are carried out")
    p.add_argument("--ladder", default=None, metavar="SPEC",
                   help="ladder policy overrides: rung attempts and budgets, e.g. "
                        "'retry=1,rollback=0,time_budget=600'")
    p.add_argument("--sdc-every", type=integer, default=None,
                   help="bitwise check of redundant hosts every K steps (0: off; default: "
                        "--ckpt-every when a bit flip is scheduled)")
    p.add_argument("--out", default=out, help="journal, checkpoints, figure")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest valid checkpoint (exit 7 "
                        "when there is none)")
    p.add_argument("--json", action="store_true")


def _job_kwargs(a: argparse.Namespace) -> dict:
    """The JobSpec's fields from the flags; ``ft``: the FTConfig from the flags."""
    from unbroken.supervise.spec import FTConfig

    ft = FTConfig(redundancy=a.redundancy, spares=a.spares, standby_p=a.standby_p,
                  staleness=a.staleness, supervisor_staleness=a.supervisor_staleness,
                  ckpt_every=a.ckpt_every, metrics_port=a.metrics_port, xid_log=a.xid_log,
                  sdc_every=a.sdc_every, ladder=a.ladder, node_staleness=a.node_staleness,
                  guard=a.guard or ("act" if a.chaos is not None else "log"))
    return dict(groups=a.groups, steps=a.steps, seed=a.seed, faults=a.faults, chaos=a.chaos,
                chaos_faults=a.chaos_faults, out=a.out, resume=a.resume, ft=ft,
                stragglers=a.stragglers, target_loss=a.target_loss, local_nodes=a.local_nodes,
                nodes=a.nodes, listen=a.listen,
                sync=a.sync, selector=a.selector)


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trainer", required=True, metavar="PKG.MOD:FACTORY",
                   help="an importable factory(cfg, **trainer_args) returning a "
                        "unbroken.ModuleTrainer or any TrainerLike; or 'gpt' / 'mlp'")
    p.add_argument("--trainer-args", default="{}", metavar="JSON",
                   help="the factory's keyword arguments (model hyperparameters), a JSON "
                        "object")
    p.add_argument("--shard-size", type=integer, default=8,
                   help="samples per shard type per step (each group's micro-batch)")
    p.add_argument("--ranks-per-group", type=integer, default=1, metavar="R",
                   help="processes in one data-parallel group, the model sharded over them "
                        "by --shard (1: a group is one process); any rank's failure is its "
                        "whole group's")
    p.add_argument("--shard", default="none", metavar="fsdp|tp|none",
                   help="how a group's ranks share the model: fsdp (torch's FSDP2), tp "
                        "(torch's tensor parallelism, the trainer's tp_plan) or none (R = 1)")
    p.add_argument("--max-procs", type=integer, default=128, metavar="N",
                   help="worker processes this launcher may start: groups x ranks (128)")
    p.add_argument("--device", default="cpu", metavar="cpu|cuda",
                   help="where the model computes: cpu (collectives over gloo) or cuda (a GPU "
                        "for each process, collectives over NCCL)")
    _job_args(p, steps=200, out="out/run")
    p.add_argument("--fresh", action="store_true",
                   help="start over in an --out that holds a run (it is moved aside, kept)")
    p.add_argument("--store", default="tcp", metavar="tcp|etcd://HOST:PORT[,...]",
                   help="where the job's durable state lives: tcp (the embedded TCPStore, one "
                        "machine; default) or an etcd v3 cluster (membership, generation, "
                        "committed step, the supervisor's lease); nothing per step goes there")
    p.add_argument("--job", default="unbroken", metavar="NAME",
                   help="with --store etcd://: the job's name, its keys' prefix "
                        "/unbroken/NAME/ (a prefix holding another job: exit 2)")
    p.add_argument("--standby", action="store_true",
                   help="with --store etcd://: a standby supervisor for the job started with "
                        "the same flags: warm, it waits for the active one's lease to expire, "
                        "then adopts the running members (or, if none re-attach, continues "
                        "from the newest checkpoint in --out)")
    p.add_argument("--rejoin", action="store_true", help=argparse.SUPPRESS)  # set by
    # supervise.coordinated.stand_by_again: a supervisor that lost this job's lease
    p.add_argument("--lease-ttl", type=positive_int, default=3, metavar="S",
                   help="with --store etcd://: the supervisor's lease (s): a standby takes "
                        "over this long after the active supervisor is lost")
    p.add_argument("--reattach-timeout", type=positive_float, default=60.0, metavar="S",
                   help="with --store etcd://: how long the members of a job whose supervisor "
                        "is lost wait for a standby (then each exits 5 with its checkpoint)")
    p.add_argument("--adopt-timeout", type=positive_float, default=15.0, metavar="S",
                   help="with --store etcd://: how long a standby taking over waits for a "
                        "member to re-attach before it counts it lost and replaces it (below "
                        "--reattach-timeout: the members wait for its go that long)")


def add_demo_args(p: argparse.ArgumentParser) -> None:
    _job_args(p, steps=200, out="out/demo")


def add_agent_args(p: argparse.ArgumentParser) -> None:
    from unbroken.nodes.agent import build_parser

    build_parser(p)


def run(a: argparse.Namespace) -> dict | int:
    return {"run": cmd_run, "demo": cmd_demo, "agent": cmd_agent}[a.command](a)


def _live(a: argparse.Namespace, groups: int, steps: int, go):
    """Run ``go(view, emit_line)`` under the live view (a terminal) or with one line per
    event on stderr (piped), or silently with --json."""
    from rich.console import Console
    from rich.live import Live

    from unbroken.demo_view import LiveView

    err = Console(stderr=True)
    view = LiveView({"groups": groups, "steps": steps})
    if err.is_terminal and not a.json:
        with Live(view, console=err, refresh_per_second=8):
            return go(view, None)
    return go(view, None if a.json else err.print)


def cmd_run(a: argparse.Namespace) -> dict:
    from unbroken.supervise import JobSpec, Supervisor

    try:
        args = json.loads(a.trainer_args)
    except ValueError:
        raise UsageError(f"--trainer-args {a.trainer_args!r}: not JSON") from None
    if not isinstance(args, dict):
        raise UsageError(f"--trainer-args {a.trainer_args!r}: expected a JSON object (the "
                         f"factory's keyword arguments)")
    spec = JobSpec(trainer=a.trainer, trainer_args=args, shard_size=a.shard_size,
                   fresh=a.fresh, ranks_per_group=a.ranks_per_group, shard=a.shard,
                   max_procs=a.max_procs, device=a.device, **_job_kwargs(a))
    from unbroken import spawn

    spawn.quick_resolver()  # before its first store connection (spawn.RESOLVER_OPTIONS)
    flags = _store_flags(a)  # before the trainer is built: a bad flag answers in a second
    sup = Supervisor(spec)
    sup.check()  # bad input (the trainer included): one line before any process starts
    sup.coordinator = _coordinator(a, spec, sup, flags)
    if sup.coordinator is not None and getattr(a, "argv", None) is not None:
        from unbroken.supervise.coordinated import stand_by_again

        sup.on_lease_lost = stand_by_again(a.argv)
    _node_warning(spec)

    def go(view, emit_line):
        sup.view, sup.emit_line = view, emit_line
        return sup.run()
    res = _live(a, spec.groups, spec.steps, go)
    if res.code != 0:
        raise Stopped(res.message, int(res.code), res.report)
    return res.report


def _store_flags(a: argparse.Namespace):
    """``--store``, ``--job``, ``--standby`` and the two timeouts, checked without building
    anything (UsageError, one line): the parsed etcd store and job name, or None for the
    embedded TCPStore."""
    from unbroken.core.coordination import check_job_name, parse_store

    try:
        store, job = parse_store(a.store), check_job_name(a.job)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if store.kind == "tcp":
        if a.standby:
            raise UsageError("--standby: needs --store etcd://HOST:PORT[,...] (the lease "
                             "lives there)")
        return None
    if a.adopt_timeout >= a.reattach_timeout:
        raise UsageError(f"--adopt-timeout {a.adopt_timeout:g}: must be below "
                         f"--reattach-timeout {a.reattach_timeout:g} (the members wait that "
                         f"long for the standby's go)")
    return store, job


def _coordinator(a: argparse.Namespace, spec, sup, flags):
    """``--store etcd://``: the job's durable state and lease (``supervise.coordinated``),
    opened before any process starts; None with the embedded TCPStore (``flags`` None, else
    ``_store_flags``'s store and job)."""
    if flags is None:
        return None
    store, job = flags
    from unbroken.supervise.coordinated import job_identity, open_job

    sup.adopt_timeout = a.adopt_timeout
    co = open_job(store, job, job_identity(spec), standby=a.standby, ttl=a.lease_ttl,
                  line=sup._line, rejoin=a.rejoin)
    co.reattach_timeout = a.reattach_timeout
    return co


def cmd_demo(a: argparse.Namespace) -> dict:
    from unbroken.demo import DemoExit, check, demo_spec, run_demo

    spec = demo_spec(**_job_kwargs(a))
    check(spec)  # bad input: one line before any process starts
    _node_warning(spec)
    try:
        return _live(a, spec.groups, spec.steps,
                     lambda view, emit_line: run_demo(spec, view=view, emit_line=emit_line))
    except DemoExit as e:
        raise Stopped(str(e), e.code, e.report) from None


def _node_warning(spec) -> None:
    """With node agents, a placement that cannot keep a node loss safe is a warning."""
    from unbroken.supervise.spec import node_warning

    if (spec.local_nodes or spec.nodes) and (warn := node_warning(spec)):
        flag = "--local-nodes" if spec.local_nodes else "--nodes"
        sys.stderr.write(f"unbroken: warning: {flag} {warn}\n")


def cmd_agent(a: argparse.Namespace) -> int:
    from unbroken.nodes import agent

    try:
        return agent.run(a)
    except agent.AgentError as e:
        raise UsageError(str(e)) from None


def show(con, a: argparse.Namespace, data: dict) -> None:
    from unbroken.demo_report import print_report

    print_report(con, data, title=a.command.capitalize())
