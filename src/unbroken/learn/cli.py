"""What ``unbroken learn`` does with its parsed flags; ``unbroken.cli`` only parses and prints.

``run(a)`` returns plain data (what ``--json`` prints); ``show(console, a, data)`` is the
terminal view. Bad input raises a ValueError subclass whose message names the bad value (the
command prints it on one line and exits 2).
"""

from __future__ import annotations

import argparse

__all__ = ["run", "show"]


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
