"""What ``unbroken sync ...`` and ``unbroken plan --stragglers`` do; ``unbroken.cli`` only
parses and prints.

``run(a)`` returns plain data (what ``--json`` prints), ``show(console, a, data)`` is the
terminal view. Bad input raises ValueError whose message names the bad value (the command
prints it on one line and exits 2).
"""

from __future__ import annotations

import argparse

from unbroken.cliargs import nonneg_float, positive_int

__all__ = ["add_args", "add_plan_args", "run", "show", "plan", "show_plan",
           "load_predictor", "load_selector"]


def add_args(sp: argparse.ArgumentParser) -> None:
    """The ``sync`` subcommands."""
    acts = sp.add_subparsers(dest="action", required=True)
    tp = acts.add_parser("train-predictor", help="train the LSTM straggler predictor")
    tp.add_argument("--journals", nargs="+", default=[], metavar="DIR",
                    help="run directories holding group-U.jsonl journals")
    tp.add_argument("--synthetic", type=positive_int, default=0, metavar="N",
                    help="also train on N synthetic runs (bursty, persistent, rotating)")
    tp.add_argument("--out", required=True, help="model file to write")
    tp.add_argument("--epochs", type=positive_int, default=20)
    tp.add_argument("--seed", type=int, default=0)
    tp.add_argument("--json", action="store_true")
    ep = acts.add_parser("eval-predictor", help="the predictor against last-value: MAE, "
                                                "straggler precision and recall")
    ep.add_argument("--model", required=True)
    src = ep.add_mutually_exclusive_group(required=True)
    src.add_argument("--journals", nargs="+", metavar="DIR")
    src.add_argument("--synthetic", type=positive_int, metavar="N",
                     help="N held-out synthetic runs (seeded apart from training's)")
    ep.add_argument("--seed", type=int, default=1)
    ep.add_argument("--json", action="store_true")
    ts = acts.add_parser("train-selector", help="train the ML mode selector on simulated "
                                                "profiles labelled by the heuristic")
    ts.add_argument("--out", required=True)
    ts.add_argument("--groups", type=positive_int, default=8)
    ts.add_argument("--examples", type=positive_int, default=2000)
    ts.add_argument("--held-out", type=positive_int, default=300,
                    help="held-out profiles to compare with the heuristic on")
    ts.add_argument("--seed", type=int, default=0)
    ts.add_argument("--runtime", action="store_true",
                    help="label as the runtime's auto decides (its cost model and modes): "
                         "the selector for run --sync auto --selector FILE")
    ts.add_argument("--shard-batch", type=positive_int, default=None, metavar="B",
                    help="with --runtime: the job's samples per group per step (default 8)")
    ts.add_argument("--redundancy", type=positive_int, default=None, metavar="R",
                    help="with --runtime: the job's SPARe redundancy (default 2)")
    ts.add_argument("--cores", type=positive_int, default=None, metavar="C",
                    help="with --runtime: the CPU cores the job's groups share on one machine "
                         "(a run sets it when its groups outnumber the machine's cores; "
                         "default: a device per group)")
    ts.add_argument("--json", action="store_true")


def add_plan_args(pl: argparse.ArgumentParser) -> None:
    """``plan --stragglers`` and the numbers its cost model needs."""
    g = pl.add_argument_group("stragglers (issue 11: sync modes)")
    g.add_argument("--stragglers", metavar="SPEC",
                   help="plan sync modes instead: persistent:G@F, bursty:SEED, rotating:P or a "
                        "CSV file step,group,slowdown")
    g.add_argument("--noise-scale", type=nonneg_float, metavar="PHI",
                   help="gradient noise scale in samples (default: the global batch, N x B)")
    g.add_argument("--shard-batch", type=positive_int, default=8, metavar="B",
                   help="samples per group per step")
    g.add_argument("--mask-redundancy", type=positive_int, default=2, metavar="R",
                   help="SPARe redundancy available to mask (1: no mask)")
    g.add_argument("--straggler-steps", type=positive_int, default=300,
                   help="steps of the profile to evaluate")
    g.add_argument("--cores", type=positive_int, default=None, metavar="C",
                   help="the CPU cores the groups share on one machine, as a run sets it when "
                        "its groups outnumber them (default: a device per group)")


def plan(a: argparse.Namespace, sc) -> dict:
    from unbroken.core.sync import CostModel
    from unbroken.sync.plan import straggler_plan

    phi = a.noise_scale if a.noise_scale is not None else float(sc.groups * a.shard_batch)
    # the runtime's own selector: ksync priced as the runtime runs it (deferral)
    cm = CostModel.for_runtime(a.shard_batch, a.mask_redundancy, noise_scale=phi,
                               comm_s=sc.allreduce, seed=a.seed, cores=a.cores or 0)
    return straggler_plan(a.stragglers, sc.groups, a.straggler_steps, sc.t_compute,
                          sc.allreduce, cm, seed=a.seed)


def show_plan(con, data: dict) -> None:
    from unbroken.sync.plan import plan_lines

    con.print("\n".join(plan_lines(data)), highlight=False)


def load_predictor(path: str):
    """The predictor saved in ``path``; ModelFileError (a ValueError) naming the file."""
    from unbroken.runtime.modelfile import load_model
    from unbroken.sync.predictor import Predictor

    return load_model(path, "predictor", Predictor)


def load_selector(path: str):
    """The ML selector saved in ``path``; ModelFileError naming the file."""
    from unbroken.runtime.mlselector import load_selector

    return load_selector(path)


def _runs(journals, synthetic: int, seed: int):
    from unbroken.sync.journal import read_journals, to_array
    from unbroken.sync.synthetic import synthetic_runs

    runs = [to_array(r) for r in read_journals(journals or [])]
    if synthetic:
        runs += [to_array(r) for r in synthetic_runs(synthetic, seed=seed)]
    return runs


def run(a: argparse.Namespace) -> dict:
    if a.action == "train-predictor":
        return _train_predictor(a)
    if a.action == "eval-predictor":
        return _eval_predictor(a)
    return _train_selector(a)


def _train_predictor(a: argparse.Namespace) -> dict:
    from unbroken.runtime import modelfile
    from unbroken.sync.predictor import train_predictor

    if not a.journals and not a.synthetic:
        raise ValueError("train-predictor needs --journals DIR ... or --synthetic N")
    runs = _runs(a.journals, a.synthetic, a.seed)
    p = train_predictor(runs, seed=a.seed, epochs=a.epochs)
    p.meta["journals"] = list(a.journals)
    p.meta["synthetic"] = a.synthetic
    sha = modelfile.save(a.out, "predictor", p.state, p.meta)
    return {"action": "train-predictor", "out": a.out, "sha256": sha, **p.meta}


def _eval_predictor(a: argparse.Namespace) -> dict:
    from unbroken.sync.predictor import evaluate, last_value

    p = load_predictor(a.model)
    runs = _runs(a.journals, a.synthetic or 0, 1000 + a.seed)
    lstm, last = evaluate(p.predict, runs), evaluate(last_value, runs)
    return {"action": "eval-predictor", "model": a.model, "runs": len(runs),
            "lstm": lstm, "last_value": last}


def _train_selector(a: argparse.Namespace) -> dict:
    from unbroken.runtime import modelfile
    from unbroken.sync.selector import compare, train_selector

    if not a.runtime and (a.shard_batch is not None or a.redundancy is not None
                          or a.cores is not None):
        raise ValueError("train-selector: --shard-batch, --redundancy and --cores describe the "
                         "job a runtime selector is for; they need --runtime")
    s = train_selector(groups=a.groups, n=a.examples, seed=a.seed, runtime=a.runtime,
                       shard_batch=a.shard_batch or 8, redundancy=a.redundancy or 2,
                       cores=a.cores or 0)
    s.meta["held_out"] = compare(s, n=a.held_out, seed=a.seed + 1)
    sha = modelfile.save(a.out, "selector", s.state, s.meta)
    return {"action": "train-selector", "out": a.out, "sha256": sha,
            **{k: v for k, v in s.meta.items() if k not in ("mean", "std")}}


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def show(con, a: argparse.Namespace, data: dict) -> None:
    act = data["action"]
    if act == "train-predictor":
        con.print(f"predictor: {data['windows']} windows, {data['epochs']} epochs in "
                  f"{data['train_s']:.1f} s, train L1 {data['train_l1']:.4f} -> {data['out']} "
                  f"(sha256 {data['sha256'][:12]})", highlight=False)
    elif act == "eval-predictor":
        con.print(f"{'predictor':<12}{'MAE':>10}{'rel MAE':>9}{'precision':>11}{'recall':>8}",
                  highlight=False)
        for name in ("lstm", "last_value"):
            r = data[name]
            con.print(f"{name:<12}{r['mae_s'] * 1000:>8.2f}ms{r['rel_mae']:>9.1%}"
                      f"{_pct(r['precision']):>11}{_pct(r['recall']):>8}", highlight=False)
        con.print(f"({data['runs']} runs, {data['lstm']['points']} predicted step times, "
                  f"{data['lstm']['stragglers']} true straggler points at 20 %)",
                  highlight=False)
    else:
        h = data["held_out"]
        con.print(f"selector for {data['groups']} groups: {data['examples']} profiles "
                  f"labelled in {data['label_s']:.1f} s -> {data['out']}", highlight=False)
        con.print(f"held out ({h['profiles']}): agrees with the heuristic on "
                  f"{h['agreement']:.1%}; TTA regret vs heuristic mean {h['regret_mean']:+.2%}, "
                  f"max {h['regret_max']:+.2%}; vs best in hindsight: heuristic "
                  f"{h['heuristic_vs_hindsight']:+.2%}, ML {h['ml_vs_hindsight']:+.2%}",
                  highlight=False)
