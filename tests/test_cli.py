"""The command line, run as a user runs it: a real subprocess, its exit code and its output."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.mp


THEORY_KEYS = {"mu", "overhead_lower_bound", "overhead", "r_star", "r_star_closed_form",
               "ckpt_period_s", "availability", "ttt_over_t0"}


def test_theory_json_has_every_key_for_both_strategies(cli):
    p = cli("theory", "--groups", "600", "--redundancy", "8", "--mc-trials", "1", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert THEORY_KEYS <= out.keys()
    assert THEORY_KEYS <= out["replication"].keys()
    # the corrected J's minimiser is the simulation's best r at N = 600 (README); the paper's
    # J and its closed form give 10
    assert out["r_star"] == 9
    assert out["r_star_paper"] == out["r_star_closed_form"] == 10
    assert out["mu"] == pytest.approx(254.0, abs=0.1)


def test_theory_accepts_durations_in_every_form(cli):
    a = json.loads(cli("theory", "--groups", "600", "--redundancy", "8", "--mtbf", "5m",
                       "--restart", "1h", "--ckpt-save", "60s", "--mc-trials", "0",
                       "--json").stdout)
    b = json.loads(cli("theory", "--groups", "600", "--redundancy", "8", "--mtbf", "300",
                       "--restart", "3600", "--ckpt-save", "1m", "--mc-trials", "0",
                       "--json").stdout)
    assert a == b


def test_simulate_json_is_deterministic_per_seed(cli):
    args = ("simulate", "--strategy", "spare", "--groups", "200", "--redundancy", "6",
            "--steps", "1500", "--seeds", "2", "--seed", "7", "--json")
    first, second = json.loads(cli(*args).stdout), json.loads(cli(*args).stdout)
    for key in ("ttt_over_t0", "availability", "wipeouts", "masked_failures",
                "mean_stack_depth", "per_seed", "wall_s"):
        assert key in first
    first.pop("wall_s"), second.pop("wall_s")
    assert first == second
    assert [p["seed"] for p in first["per_seed"]] == [7, 8]
    # the summary is the mean over the seeds; wipe-outs cost availability
    per_seed = [p["availability"] for p in first["per_seed"]]
    assert first["availability"] == pytest.approx(sum(per_seed) / 2)
    assert first["wipeouts"] > 0 and first["availability"] < 1


def test_simulate_checkpoint_interval_auto_and_fixed(cli):
    base = ("simulate", "--strategy", "rep", "--groups", "200", "--redundancy", "3",
            "--steps", "500", "--json")
    fixed = json.loads(cli(*base, "--ckpt-every", "7").stdout)
    auto = json.loads(cli(*base, "--ckpt-every", "auto").stdout)
    assert fixed["ckpt_every"] == 7
    # 'auto' is the optimal checkpoint period of the theory (T_c*), in steps
    theory = json.loads(cli("theory", "--groups", "200", "--redundancy", "3", "--mc-trials", "0",
                            "--json").stdout)
    assert auto["ckpt_every"] == theory["replication"]["ckpt_every_steps"]


def test_plan_small_cluster_writes_png_and_recommends(cli, tmp_path):
    png = tmp_path / "plan.png"
    p = cli("plan", "--groups", "60", "--gpus", "6000", "--steps", "300", "--seeds", "2",
            "--r-max", "4", "--png", str(png), "--nodes", "10", "--json")
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    # the node placement at SPARe's best r, and the fewest nodes for every r swept
    nodes = plan["nodes"]
    assert nodes["redundancy"] == plan["spare"]["best"]["redundancy"]
    assert sorted(len(ws) for ws in nodes["groups_on"]) == [6] * 10
    assert {int(r) for r in nodes["needed_by_r"]} == {2, 3, 4}
    assert nodes["needed_by_r"]["2"] == 2 and nodes["needed_by_r"]["3"] == 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rec = plan["recommendation"]
    # the lowest simulated time-to-train of the two strategies' best redundancies
    best = min(("spare", "rep"), key=lambda s: plan[s]["best"]["ttt_over_t0"])
    assert rec["strategy"] == best
    assert rec["redundancy"] == plan[best]["best"]["redundancy"]
    assert rec["ttt_over_t0"] == plan[best]["best"]["ttt_over_t0"]
    assert rec["reason"].startswith(f"{best} r={rec['redundancy']} ")
    for s in ("spare", "rep"):
        assert [row["redundancy"] for row in plan[s]["sweep"]] == [2, 3, 4]
        best = plan[s]["best"]
        assert best["ttt_over_t0"] == min(row["sim"]["ttt_over_t0"] for row in plan[s]["sweep"])


def test_plan_terminal_view_shows_the_tables(cli, tmp_path):
    p = cli("plan", "--groups", "60", "--gpus", "6000", "--steps", "200", "--seeds", "1",
            "--r-max", "3", "--png", str(tmp_path / "p.png"))
    assert p.returncode == 0, p.stderr
    assert "Recommendation" in p.stdout and "SPARe+CKPT" in p.stdout


BAD = [
    (["theory", "--groups", "0", "--redundancy", "3"], "--groups"),
    (["theory", "--groups", "abc", "--redundancy", "3"], "'abc'"),
    (["theory", "--groups", "600", "--redundancy", "-1"], "'-1'"),
    (["theory", "--groups", "200", "--redundancy", "13"], "213"),
    (["theory", "--groups", "600", "--redundancy", "28"], "27"),
    (["theory", "--groups", "5", "--redundancy", "6"], "groups"),
    (["simulate", "--strategy", "magic", "--groups", "600", "--redundancy", "3"], "'magic'"),
    (["theory", "--groups", "600", "--redundancy", "3", "--mtbf", "5 minutes"], "5 minutes"),
    (["theory", "--groups", "600", "--redundancy", "3", "--restart=-1h"], "-1h"),
    (["theory", "--groups", "600", "--redundancy", "3", "--mtbf", "5m", "--gpu-mtbf", "9h"],
     "conflict"),
    (["simulate", "--strategy", "ckpt", "--groups", "600", "--redundancy", "3"], "conflicts"),
    (["simulate", "--strategy", "rep", "--groups", "600", "--redundancy", "3", "--fail",
      "exponential", "--weibull-shape", "0.7"], "conflicts"),
    (["simulate", "--strategy", "spare", "--groups", "600"], "--redundancy"),
    (["simulate", "--strategy", "rep", "--groups", "600", "--redundancy", "3",
      "--ckpt-every", "often"], "'often'"),
    (["plan", "--gpus", "100"], "fewer than groups"),
    (["plan", "--steps", "0"], "'0'"),
    (["plan", "--r-max", "1"], "--r-max"),
    (["plan", "--groups", "2", "--gpus", "100"], "groups 2 too small"),
    # values no cluster has: refused, naming the flag and the value
    (["theory", "--groups", "600", "--redundancy", "8", "--mtbf", "1e-300"], "--mtbf: mtbf 1e-300"),
    (["theory", "--groups", "600", "--redundancy", "8", "--restart", "1e300"],
     "--restart: t_restart 1e+300"),
    (["simulate", "--strategy", "spare", "--groups", "600", "--redundancy", "8",
      "--gpu-mtbf", "1s"], "--gpu-mtbf"),
    (["simulate", "--strategy", "rep", "--groups", "600", "--redundancy", "3",
      "--ckpt-save", "1e9"], "--ckpt-save"),
    (["theory", "--groups", "600", "--redundancy", "8", "--weibull-shape", "1e-9"],
     "--weibull-shape"),
    (["plan", "--groups", "600", "--step-time", "1e12"], "--step-time"),
    (["plan", "--png", "/etc/hostname/plan.png"], "'/etc/hostname' is a file"),
    # more nodes than groups: refused before the sweep / the Monte-Carlo
    (["plan", "--nodes", "601"], "--nodes: nodes 601 exceeds the number of groups 600"),
    (["theory", "--groups", "32", "--redundancy", "3", "--nodes", "33"], "nodes 33 exceeds"),
    (["theory", "--groups", "32", "--redundancy", "3", "--nodes", "0"], "--nodes"),
    (["theory", "--groups", "32", "--redundancy", "3", "--nodes", "-2"], "'-2'"),
    # root passes os.access on /proc, but nothing can be created there: tried, not guessed
    (["plan", "--png", "/proc/plan.png"], "--png '/proc/plan.png' cannot be written"),
]


@pytest.mark.parametrize("args,named", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_no_traceback(cli, args, named):
    p = cli(*args)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert named in lines[0]


def test_theory_reports_the_node_placement_and_warns_when_a_node_loss_is_unsafe(cli):
    base = ("theory", "--groups", "32", "--redundancy", "3", "--mc-trials", "0")
    p = cli(*base, "--nodes", "4", "--json")
    assert p.returncode == 0 and p.stderr == ""
    nodes = json.loads(p.stdout)["nodes"]
    assert nodes["safe"] and nodes["conflicts"] == [] and nodes["nodes_needed"] == 4
    assert nodes["groups_on"][0] == list(range(0, 32, 4))
    # 3 nodes cannot separate groups 0..3 (they pairwise share a type): a warning, exit 0
    p = cli(*base, "--nodes", "3", "--json")
    assert p.returncode == 0
    nodes = json.loads(p.stdout)["nodes"]
    assert not nodes["safe"] and nodes["proved"] and nodes["conflicts"]
    warn = [ln for ln in p.stderr.splitlines() if "warning: --nodes 3" in ln]
    assert len(warn) == 1 and "it takes 4 nodes" in warn[0]
    text = cli(*base, "--nodes", "3").stdout
    assert "Nodes: 32 groups (r=3) on 3 nodes" in text and "fewest nodes" in text


def test_plan_checks_the_figure_path_before_the_sweep(cli, tmp_path):
    """The default sweep takes ~40 s; an unwritable --png answers long before that."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = cli("plan", "--png", str(blocker / "sub" / "plan.png"), timeout=20)
    assert p.returncode == 2 and "is a file" in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_plan_says_when_r_max_is_capped(cli, tmp_path):
    p = cli("plan", "--groups", "50", "--gpus", "5000", "--r-max", "30", "--steps", "60",
            "--seeds", "1", "--png", str(tmp_path / "p.png"), "--json")
    assert p.returncode == 0, p.stderr
    assert "--r-max 30 capped at r = 6 for SPARe+CKPT: N = 50 supports r <= 6" in p.stderr
    assert "N >= 51" in p.stderr
    plan = json.loads(p.stdout)
    assert [row["redundancy"] for row in plan["spare"]["sweep"]] == [2, 3, 4, 5, 6]
    assert [row["redundancy"] for row in plan["rep"]["sweep"]][-1] == 30
    assert len(plan["notes"]) == 1 and "capped at r = 6" in plan["notes"][0]


def test_theory_warns_when_its_answer_means_little(cli):
    p = cli("theory", "--groups", "600", "--redundancy", "8", "--mtbf", "10s", "--mc-trials",
            "0", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert "shorter than one failure-free step" in p.stderr
    assert out["caveats"] and "simulate instead" in out["caveats"][0]
    quiet = json.loads(cli("theory", "--groups", "600", "--redundancy", "8", "--mc-trials",
                           "0", "--json").stdout)
    assert quiet["caveats"] == []


def test_the_planner_never_imports_torch(tmp_path):
    code = ("import sys; from unbroken.cli import main; "
            f"rc = main(['plan', '--groups', '60', '--gpus', '600', '--steps', '100', "
            f"'--seeds', '1', '--r-max', '3', '--jobs', '1', '--png', r'{tmp_path / 'p.png'}', "
            "'--json']); assert rc == 0; "
            "main(['theory', '--groups', '600', '--redundancy', '8', '--mc-trials', '1', "
            "'--json']); "
            "print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "False"


# ---------------------------------------------------------------- demo: bad input, end to end
@pytest.mark.parametrize("args, needle", [
    (["--groups", "1"], "--groups 1"),
    (["--groups", "4", "--redundancy", "3"], "redundancy 3"),
    (["--faults", "kill:1@20,boom:2@30"], "boom"),
    (["--faults", "kill:9@20"], "kill:9@20"),
    (["--faults", "kill:1@20,hang:1@20"], "hang:1@20"),
    (["--steps", "abc"], "abc"),
    (["--faults", "stall:2@10"], "needs --guard act"),
    (["--faults", "nan:1@10"], "'nan:1@10' needs --guard act"),
    (["--faults", "flip:1@10", "--guard", "log"], "'flip:1@10' needs --guard act"),
    (["--faults", "update:1@10"], "update@step"),
    (["--chaos", "3", "--faults", "none"], "exclude each other"),
    (["--chaos", "-1"], "-1"),
    (["--ladder", "retry=often"], "retry='often'"),
    (["--ladder", "mask=0,evict=0,retry=0,rollback=0,replay=0,restart=0,requeue=0"],
     "zero attempts on every rung"),
    (["--ladder", "time_budget=-5"], "time_budget=-5"),
    (["--standby-p", "1.5"], "p=1.5"),
    (["--standby-p", "0.1", "--spares", "2"], "exclude each other"),
])
def test_demo_bad_input_is_one_line_exit_2(cli, args, needle, tmp_path):
    r = cli("demo", "--out", str(tmp_path), *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and needle in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def _terminal_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


@pytest.mark.timeout(90)
def test_ctrl_c_stops_plan_and_its_pool_at_once_without_a_traceback(tmp_path):
    """A real SIGINT to the whole process group, as a terminal's Ctrl-C sends it, while the
    pool of the default sweep (~40 s) is simulating: out within seconds, exit 130, one line,
    and no worker left behind."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    with open("/proc/self/status") as f:  # what a child would inherit (shown on a failure)
        print("test process:", signal.getsignal(signal.SIGINT),
              [x.strip() for x in f if x.startswith(("SigIgn", "SigBlk"))])
    # as a shell starts a foreground command: SIGINT at its default and not blocked, whatever
    # this process inherited (a disposition or mask set here would make the child deaf to it)
    p = subprocess.Popen([sys.executable, "-m", "unbroken", "plan", "--jobs", "2", "--png",
                          str(tmp_path / "p.png")], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=_terminal_sigint)
    try:
        deadline = time.monotonic() + 30
        while len(_children(p.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _children(p.pid)
        assert len(workers) >= 2, "the pool never started"
        time.sleep(1.0)                                   # the workers are simulating now
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=20)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert elapsed < 5, f"took {elapsed:.1f} s to stop"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == "unbroken: plan interrupted"
    assert out == ""
    gone = time.monotonic() + 5
    while time.monotonic() < gone and any(os.path.exists(f"/proc/{w}") for w in workers):
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{w}") for w in workers), "a worker survived"


def test_simulate_at_100000_groups_answers_within_its_budget_with_progress():
    """The issue's case: no answer after 200 s before. Now the default 10,000 steps stop at
    --budget with the progress bar on stderr (FORCE_COLOR: rich draws as on a terminal) and
    a warning that the TTT is a lower bound."""
    import os as _os

    env = dict(_os.environ, FORCE_COLOR="1")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "unbroken", "simulate", "--strategy", "spare",
                        "--groups", "100000", "--redundancy", "27", "--budget", "4s",
                        "--json"], capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["stopped"] == ["budget"] and out["completed"] is False
    assert "simulating 1 seed(s)" in p.stderr
    assert "ran out of its share of --budget 4s" in p.stderr and "lower bound" in p.stderr
    assert elapsed < 4 + 40          # the budget plus start-up on a loaded machine
    assert out["wall_s"] < 4 + 2


def test_theory_at_100000_groups_answers_within_its_budget(cli):
    p = cli("theory", "--groups", "100000", "--redundancy", "27", "--budget", "2s", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["mc_trials_done"] < out["mc_trials"] and out["mc_failures_seen"] > 0
    assert "--budget 2s ended the controller Monte-Carlo" in p.stderr
    assert out["caveats"] and "shorter than one failure-free step" in out["caveats"][0]
    assert out["r_star_closed_form"] == 17


def test_simulate_says_failures_cost_time_at_a_long_allreduce(cli):
    """The issue's correctness case at a size a test can afford: an all-reduce far longer than
    the MTBF. With failures the run is slower than without; the authors' shortcut is not."""
    base = ("simulate", "--strategy", "spare", "--groups", "2000", "--gpus", "600000",
            "--redundancy", "20", "--steps", "30", "--allreduce", "1000", "--json")
    with_f = json.loads(cli(*base).stdout)["ttt_over_t0"]
    free = json.loads(cli(*base, "--mtbf", "100000d").stdout)["ttt_over_t0"]
    short = json.loads(cli(*base, "--paper-shortcut").stdout)["ttt_over_t0"]
    assert with_f > free > short


def test_plan_and_simulate_charge_a_rank_failure_to_its_group(cli):
    # R ranks a group, Weibull k = 0.78: the first of R fresh ranks fails early, so a group of
    # 8 ranks fails more often than a group of one at the same system MTBF; the simulator
    # draws every rank and charges the first failure to the group (slower to train), and the
    # closed forms follow it
    sim = ("simulate", "--strategy", "spare", "--groups", "100", "--gpus", "1600",
           "--redundancy", "5", "--steps", "800", "--seeds", "2", "--json")
    one = json.loads(cli(*sim).stdout)
    eight = json.loads(cli(*sim, "--ranks-per-group", "8").stdout)
    assert eight["ttt_over_t0"] > one["ttt_over_t0"], (one["ttt_over_t0"], eight["ttt_over_t0"])
    th = ("theory", "--groups", "100", "--gpus", "1600", "--redundancy", "5", "--mc-trials",
          "0", "--json")
    assert json.loads(cli(*th, "--ranks-per-group", "8").stdout)["ttt_over_t0"] > \
        json.loads(cli(*th).stdout)["ttt_over_t0"]
    p = cli(*th, "--ranks-per-group", "20")
    assert p.returncode == 2 and p.stderr.startswith("unbroken: error: --ranks-per-group: "
                                                      "ranks_per_group 20 x groups 100"), p.stderr
