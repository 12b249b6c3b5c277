"""The learn face's command, ``unbroken learn`` (and its ``synth`` and ``rules`` actions).

``add_args(parser)`` adds its flags, ``run(a)`` returns plain data (what ``--json`` prints),
``show(console, a, data)`` is the terminal view; ``unbroken.cli`` wires them. Bad input raises
a ValueError subclass whose message names the bad value (the command prints it on one line and
exits 2).
"""

from __future__ import annotations

import argparse

from unbroken.cliargs import Parser, nonneg_int, number, positive_float, positive_int

__all__ = ["add_args", "run", "show"]


def add_args(le: argparse.ArgumentParser) -> None:
    src = le.add_mutually_exclusive_group()
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus server (query_range)")
    src.add_argument("--openmetrics", nargs="+", metavar="FILE",
                     help="OpenMetrics text files with timestamps (plain or gzip)")
    le.add_argument("--kernel-log", nargs="+", metavar="FILE", default=[],
                    help="kernel logs with XID lines (syslog or dmesg --time-format iso)")
    le.add_argument("--sacct", metavar="FILE", help="sacct --parsable2 output")
    le.add_argument("--journal", metavar="DIR", help="an unbroken run directory (journal)")
    le.add_argument("--from", dest="t_from", metavar="T", help="start (ISO time or epoch s)")
    le.add_argument("--to", dest="t_to", metavar="T", help="end (ISO time or epoch s)")
    le.add_argument("--detector", metavar="FILE",
                    help="a detector file from 'learn fit' (default: the one shipped, fitted "
                         "on synthetic clusters; never fitted on this input)")
    le.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    le.add_argument("--json", action="store_true")
    acts = le.add_subparsers(dest="action", parser_class=Parser)
    sy = acts.add_parser("synth", help="write a synthetic cluster (metrics, kern.log, sacct, "
                                       "truth.json)")
    sy.add_argument("--seed", type=nonneg_int, default=0)
    sy.add_argument("--out", required=True, metavar="DIR")
    sy.add_argument("--nodes", type=positive_int, default=63)
    sy.add_argument("--days", type=positive_float, default=3.0)
    sy.add_argument("--gpus", type=positive_int, default=2, help="GPUs per node (2, up to 8)")
    sy.add_argument("--failures", type=nonneg_int, default=10)
    sy.add_argument("--shapes", default="report", metavar="FAMILY",
                    help="early precursors' family: report, step, drift, oscillation, burst, "
                         "single (report)")
    sy.add_argument("--early", type=nonneg_int, default=2,
                    help="failures with an early precursor (2)")
    sy.add_argument("--silent", type=nonneg_int, default=0,
                    help="failures with no precursor at all (0)")
    sy.add_argument("--json", action="store_true")
    fi = acts.add_parser("fit", help="fit the precursor detector on synthetic clusters (never "
                                     "the one scored); write the detector file")
    fi.add_argument("--out", required=True, metavar="FILE")
    fi.add_argument("--families", default="report,step,drift,oscillation,burst,single",
                    help="precursor families to fit on (all)")
    fi.add_argument("--seeds", default="1000-1003", help="seeds per family: A-B or a,b,c")
    fi.add_argument("--nodes", type=positive_int, default=24)
    fi.add_argument("--days", type=positive_float, default=2.0)
    fi.add_argument("--gpus", type=positive_int, default=8)
    fi.add_argument("--failures", type=nonneg_int, default=10)
    fi.add_argument("--early", type=nonneg_int, default=3)
    fi.add_argument("--silent", type=nonneg_int, default=2)
    # inf is accepted (no limit on false alarms), unlike cliargs.nonneg_float
    fi.add_argument("--fp-budget", type=number(float, lambda v: v >= 0, "a number >= 0"),
                    default=1.0, help="false alarms per day (1.0)")
    fi.add_argument("--margin", type=number(float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
                    default=0.75, help="fit to this share of the budget (0.75)")
    fi.add_argument("--json", action="store_true")
    ru = acts.add_parser("rules", help="the calibrated detector and the memory/thermal rules "
                                       "as Prometheus alerting and recording rules (YAML)")
    ru.add_argument("--from-learn", metavar="LEARN.json",
                    help="take the calibrated detector from a 'learn --json' result")
    ru.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    ru.add_argument("--json", action="store_true")


def run(a: argparse.Namespace) -> dict:
    if a.action == "synth":
        return _synth(a)
    if a.action == "rules":
        from unbroken.learn.rules import rules_command

        return rules_command(a)
    if a.action == "fit":
        from unbroken.learn.fit import fit_command

        return fit_command(a)
    from unbroken.learn.analyze import analyze_command

    return analyze_command(a)


def _synth(a: argparse.Namespace) -> dict:
    from unbroken.learn.synth import SynthSpec, generate, write

    spec = SynthSpec(seed=a.seed, nodes=a.nodes, days=a.days, gpus=a.gpus,
                     failures=a.failures, before=min(a.early, a.failures), silent=a.silent,
                     shapes=a.shapes)
    s = generate(spec)
    paths = write(s, a.out)
    return {"action": "synth", "seed": a.seed, "nodes": a.nodes, "days": a.days,
            "gpus": a.gpus, "failures": len(s.truth["failures"]), "shapes": a.shapes,
            "scrapes": len(s.frame.t), "files": paths}


def show(con, a: argparse.Namespace, data: dict) -> None:
    if data.get("action") == "synth":
        con.print(f"synthetic cluster: {data['nodes']} nodes x {data['days']:g} days "
                  f"({data['scrapes']} scrapes), {data['failures']} failures, seed "
                  f"{data['seed']}", highlight=False)
        for role, path in data["files"].items():
            con.print(f"  {role:<11} {path}", highlight=False)
        return
    if data.get("action") == "fit":
        con.print(f"detector written to {data['out']} (sha256 {data['sha256'][:12]}...), "
                  f"fitted on {data['clusters']} synthetic clusters "
                  f"({', '.join(data['families'])}): {data['reason']}; rules: "
                  f"{data['rules_reason']}", highlight=False)
        return
    if data.get("action") == "rules":
        from unbroken.learn.rules import show_rules

        show_rules(con, data)
        return
    from unbroken.learn.report import print_summary

    print_summary(con, data)
