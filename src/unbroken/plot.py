"""The plan's figure: time-to-train and availability against redundancy, simulation points
with their spread over seeds next to the closed-form curves (the SPARe paper's Figures 6–7).
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, ScalarFormatter  # noqa: E402

_COLORS = {"spare": "tab:blue", "rep": "tab:orange"}


def check_writable(path: str | os.PathLike) -> None:
    """Raise ValueError naming ``path`` when the figure could not be written there, before a
    sweep of many seconds is spent on it: a directory, or a nearest existing ancestor that is
    not a writable directory (the folders in between are created on writing)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--png {str(path)!r} is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"--png {str(path)!r} cannot be written (no permission)")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"--png {str(path)!r} cannot be written: {str(parent)!r} is a file, "
                         "not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--png {str(path)!r} cannot be written: no permission in "
                         f"{str(parent)!r}")
    try:  # permissions do not say it all (root may "write" to /proc): try it
        import tempfile

        with tempfile.NamedTemporaryFile(dir=parent, prefix=".unbroken-probe-"):
            pass
    except OSError as e:
        raise ValueError(f"--png {str(path)!r} cannot be written: {e.strerror or e} in "
                         f"{str(parent)!r}") from None


def plan_figure(plan: dict, path: str | os.PathLike) -> Path:
    """Write the PNG atomically (temp file, then rename) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_t, ax_a) = plt.subplots(1, 2, figsize=(12, 4.8))
    for strategy in ("spare", "rep"):
        rows = plan[strategy]["sweep"]
        r = [row["redundancy"] for row in rows]
        sim = [row["sim"]["ttt_over_t0"] for row in rows]
        lo = [row["sim"]["ttt_over_t0"] - row["sim"]["ttt_over_t0_min"] for row in rows]
        hi = [row["sim"]["ttt_over_t0_max"] - row["sim"]["ttt_over_t0"] for row in rows]
        th = [row["theory"]["ttt_over_t0"] for row in rows]
        c = _COLORS[strategy]
        name = plan[strategy]["name"]
        ax_t.errorbar(r, sim, yerr=[lo, hi], fmt="o", color=c, capsize=3, ms=4,
                      label=f"{name} simulated (mean, min-max over {plan['seeds']} seeds)")
        ax_t.plot(r, th, "-", color=c, alpha=0.7, label=f"{name} theory")
        ax_a.plot(r, [100 * row["sim"]["availability"] for row in rows], "o", color=c, ms=4,
                  label=f"{name} simulated")
        ax_a.plot(r, [100 * row["theory"]["availability"] for row in rows], "-", color=c,
                  alpha=0.7, label=f"{name} theory (A*)")
    rec = plan["recommendation"]
    ax_t.plot([rec["redundancy"]], [rec["ttt_over_t0"]], marker="*", ms=16, color="tab:red",
              ls="none", label=f"recommended: {plan[rec['strategy']]['name']} "
                               f"r={rec['redundancy']}")
    sc = plan["scenario"]
    title = (f"N={sc['groups']} groups, {sc['gpus']:,} GPUs, MTBF {sc['mtbf']:g}s, "
             f"restart {sc['t_restart']:g}s, save {sc['t_save']:g}s")
    ax_t.set_yscale("log")
    ax_t.yaxis.set_major_formatter(ScalarFormatter())
    ax_t.yaxis.set_minor_formatter(ScalarFormatter())
    for ax in (ax_t, ax_a):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_t.set_xlabel("redundancy r")
    ax_t.set_ylabel("time-to-train / T0")
    ax_t.set_title("Time-to-train")
    ax_t.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    ax_a.set_xlabel("redundancy r")
    ax_a.set_ylabel("availability (%)")
    ax_a.set_title("Availability")
    ax_a.grid(True, alpha=0.3)
    ax_a.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path
