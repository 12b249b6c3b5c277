"""The ``unbroken`` command: wires each face's command line, and owns the exit codes.

Each face's CLI module adds its commands' flags, runs them and shows the result: the plan
face (``theory``, ``simulate``, ``plan``) in ``sim.cli``, the train face (``run``, ``demo``,
``agent``) in ``supervise.cli``, ``learn`` in ``learn.cli``, ``sync`` in ``sync.cli``; the
flag types and errors they share in ``cliargs``. Decisions live in unbroken.core. This module
builds the parser from them, dispatches, prints ``--json`` and turns errors into exit codes.

Exit codes (``unbroken.protocol.ExitCode``): 0 success, 1 the run could not finish (a worker
error, no survivor left; the reason on stderr), 2 bad input (one line on stderr naming the bad
value, no traceback, nothing started), 5 the members found the supervisor silent and stopped
with a checkpoint, 6 the guard's ladder gave up, 7 ``--resume`` found nothing to resume,
130 / 143 stopped by Ctrl-C / SIGTERM with a checkpoint; ``agent``: 0 told to exit, 2 bad
input (an unreachable coordinator, a node index claimed twice), 5 the coordinator's store went
away, 10 fenced (declared lost by the coordinator). A ``--nodes`` placement that cannot
keep a node loss safe is a warning (the nodes it would take), exit 0; ``--nodes`` above the
number of groups is bad input, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from unbroken.cliargs import Parser, Stopped, UsageError
from unbroken.protocol import ExitCode


def _commands() -> dict:
    """Each command, in the order ``--help`` lists them: (its face's CLI module, the function
    that adds its flags, its help line). The modules import what a command runs when it runs,
    so building every command's parser stays cheap (no torch for ``unbroken theory``)."""
    from unbroken.learn import cli as learn
    from unbroken.sim import cli as plan
    from unbroken.supervise import cli as train
    from unbroken.sync import cli as sync

    return {
        "theory": (plan, plan.add_theory_args, "closed forms for SPARe and replication"),
        "simulate": (plan, plan.add_simulate_args,
                     "discrete-event simulation of one configuration"),
        "plan": (plan, plan.add_plan_args,
                 "best redundancy and checkpoint interval per strategy"),
        "run": (train, train.add_run_args,
                "train your own model through failures (the supervisor)"),
        "demo": (train, train.add_demo_args,
                 "train a small GPT on 4 groups through real faults (a preset of run)"),
        "agent": (train, train.add_agent_args,
                  "a node agent: start this machine's groups and spares for the coordinator, "
                  "report their deaths at once"),
        "learn": (learn, learn.add_args,
                  "operations analytics over a cluster's metrics and history (precursors, "
                  "checkpoint I/O, exclusions, retry chains, numbers for plan)"),
        "sync": (sync, sync.add_args,
                 "straggler-tolerant sync modes (STAR): train and evaluate the straggler "
                 "predictor and the ML mode selector"),
    }


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="unbroken", description="Keep LLM pretraining running through failures.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, (_face, add_args, text) in _commands().items():
        add_args(sub.add_parser(name, help=text))
    return p


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from unbroken.core.placement import PlacementError
    from unbroken.core.scenario import ScenarioError
    from unbroken.metrics import MetricsError
    from unbroken.supervise.outdir import NoResumePoint
    from unbroken.supervise.outcome import RunError

    a = build_parser().parse_args(argv)
    a.argv = sys.argv[1:] if argv is None else None  # a command line may re-execute itself
    face = _commands()[a.command][0]
    try:
        data = face.run(a)
        if a.command == "agent":  # its exit code: 0 told to exit, 5, 10 (unbroken.nodes.agent)
            return int(data)
    except NoResumePoint as e:
        sys.stderr.write(f"unbroken: error: {e}\n")
        return ExitCode.NO_RESUME_POINT
    except (UsageError, PlacementError, ScenarioError, ValueError, MetricsError) as e:
        sys.stderr.write(f"unbroken: error: {e}\n")
        return ExitCode.USAGE
    except Stopped as e:  # on purpose: its documented code, the report with --json
        sys.stderr.write(f"unbroken: {a.command} stopped: {e}\n")
        if a.json and e.report is not None:
            print(json.dumps(e.report, indent=None, default=float))
        return e.code
    except RunError as e:  # the run could not finish
        sys.stderr.write(f"unbroken: {a.command} failed: {e}\n")
        return ExitCode.FAILED
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside a run: no traceback
        sys.stderr.write(f"unbroken: {a.command} interrupted\n")
        return ExitCode.INTERRUPTED
    if a.json:
        print(json.dumps(data, indent=None, default=float))
        return 0
    face.show(Console(), a, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
