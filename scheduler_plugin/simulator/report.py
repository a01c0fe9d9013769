"""Outputs of a simulation: the summary table, the curve CSV, the PNG plot and the JSON summary."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from statistics import mean

from rich.table import Table

from .engine import CHECKPOINTS, RunResult

CURVE_POINTS = tuple(range(131))


def by_policy(results: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    out: dict[str, list[RunResult]] = {}
    for r in results:
        out.setdefault(r.policy, []).append(r)
    return out


def summary_table(results: Sequence[RunResult], title: str = "GPU allocation ratio vs arrived workload") -> Table:
    """One row per policy (means over seeds): allocation at each checkpoint, GPUs unallocated, first failure, pods
    arrived (the trace's pods and the copies drawn until --target %, or fewer when the trace alone reaches it)."""
    table = Table(title=title)
    table.add_column("policy")
    table.add_column("seeds", justify="right")
    for p in CHECKPOINTS:
        table.add_column(f"alloc @{p} %", justify="right")
    table.add_column("unallocated @100 %", justify="right")
    table.add_column("first failure (arrived %)", justify="right")
    table.add_column("arrivals", justify="right")
    table.add_column("s/run", justify="right")
    for policy, runs in by_policy(results).items():
        ffs = [ff[1] for r in runs if (ff := r.first_failure) is not None]
        unalloc = mean(r.unallocated_gpus_at(100) for r in runs)
        pct = mean(100.0 - r.alloc_at(100) for r in runs)
        table.add_row(
            policy,
            str(len(runs)),
            *(f"{mean(r.alloc_at(p) for r in runs):.2f}" for p in CHECKPOINTS),
            f"{unalloc:.0f} GPUs ({pct:.2f} %)",
            f"{mean(ffs):.2f}" if ffs else "none",
            f"{mean(len(r.arrived_pct) for r in runs):.0f}",
            f"{mean(r.seconds for r in runs):.1f}",
        )
    return table


def write_curve_csv(results: Sequence[RunResult], path: Path) -> None:
    """Allocation ratio (%) at every arrived-workload percentage 0..130, one row per policy and seed (the column
    layout of the paper's published CSV)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["policy", "seed", "total_gpus", *CURVE_POINTS])
        for r in results:
            w.writerow([r.policy, r.seed, r.total_gpus, *(f"{v:.3f}" for v in r.curve(CURVE_POINTS))])


def read_curve_csv(path: Path) -> dict[str, list[list[float]]]:
    """Curves per policy (one list per seed, at :data:`CURVE_POINTS`) from a file :func:`write_curve_csv` wrote:
    plot again without running again."""
    out: dict[str, list[list[float]]] = {}
    with path.open(newline="") as fh:
        rows = csv.reader(fh)
        header = next(rows, [])
        if header[3:] != [str(x) for x in CURVE_POINTS]:
            raise ValueError(f"{path}: not a curve file (expected columns policy, seed, total_gpus, 0..130)")
        for n, row in enumerate(rows, start=2):
            try:
                out.setdefault(row[0], []).append([float(v) for v in row[3:]])
            except (IndexError, ValueError):
                raise ValueError(f"{path}: row {n}: not a policy, seed and numbers") from None
    return out


#: Line styles and markers, one per policy in order: curves that coincide (kelvin and kelvin-fragmentation on a
#: trace) stay visible as two patterns, the first drawn widest and lowest, each later one narrower on top of it.
_STYLES: tuple[str | tuple[int, tuple[float, ...]], ...] = (
    "-",
    "--",
    "-.",
    ":",
    (0, (5, 1.5, 1, 1.5, 1, 1.5)),
    (0, (1, 1)),
    (0, (8, 2)),
    (0, (3, 1, 1, 1)),
)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def line_style(k: int, n: int) -> dict[str, object]:
    """Matplotlib line properties of the ``k``-th of ``n`` policies: its own line style and marker, drawn narrower
    and higher (z-order) than the ones before it; markers only past 85 % arrived (before that every policy is on the
    ideal line), each policy's on other points."""
    return {
        "linestyle": _STYLES[k % len(_STYLES)],
        "linewidth": 1.2 + 1.8 * (n - 1 - k) / max(1, n - 1),
        "marker": _MARKERS[k % len(_MARKERS)],
        "markersize": 4.5,
        "markevery": list(range(86 + (2 * k) % 8, len(CURVE_POINTS), 8)),
        "zorder": 2 + k,
    }


def write_plot(results: Sequence[RunResult], path: Path, title: str = "") -> None:
    """Allocation ratio against arrived workload, mean over seeds per policy (band: min..max)."""
    curves = {policy: [r.curve(CURVE_POINTS) for r in runs] for policy, runs in by_policy(results).items()}
    plot_curves(curves, path, title)


def plot_curves(curves: dict[str, list[list[float]]], path: Path, title: str = "") -> None:
    """Plot ``curves`` (per policy, one curve per seed at :data:`CURVE_POINTS`): mean over seeds, min..max band;
    each policy with its own line style and markers, so that curves lying on one another all show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    xs = list(CURVE_POINTS)
    n = len(curves)
    for k, (policy, runs) in enumerate(curves.items()):
        avg = [mean(c[i] for c in runs) for i in range(len(xs))]
        lo = [min(c[i] for c in runs) for i in range(len(xs))]
        hi = [max(c[i] for c in runs) for i in range(len(xs))]
        style = line_style(k, n)
        for a in (ax, zoom):
            (line,) = a.plot(xs, avg, label=f"{policy} ({avg[100]:.2f} % @100)", **style)
            if len(runs) > 1:
                a.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0, zorder=1)
    ax.plot([0, 100, 130], [0, 100, 100], color="grey", linestyle=":", linewidth=1, label="ideal", zorder=1)
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_xlim(0, 130)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    zoom.set_xlim(85, 130)
    zoom.set_ylim(84, 100)
    zoom.set_xlabel("arrived workload (%) - zoom")
    zoom.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def json_summary(results: Sequence[RunResult]) -> dict[str, object]:
    policies: dict[str, object] = {}
    for policy, runs in by_policy(results).items():
        policies[policy] = {
            "mean_alloc_pct": {str(p): round(mean(r.alloc_at(p) for r in runs), 3) for p in CHECKPOINTS},
            "mean_unallocated_pct_at_100": round(mean(100.0 - r.alloc_at(100) for r in runs), 3),
            "runs": [r.summary() for r in runs],
        }
    return {"total_gpus": results[0].total_gpus if results else 0, "policies": policies}
