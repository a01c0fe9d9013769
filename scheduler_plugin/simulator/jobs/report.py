"""The job simulator's report: one table row per scheduler and scenario (mean over seeds), the issue's goals checked
against it, a CSV and a PNG."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from statistics import mean

from rich.table import Table

from .engine import RunMetrics

#: (summary key, column title, format): the issue's metrics, in its order.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("incomplete_gang_gpu_hours", "GPU-h held by\nincomplete gangs", "{:.1f}"),
    ("queue_p50_hours", "queue p50\n(h)", "{:.2f}"),
    ("queue_p95_hours", "queue p95\n(h)", "{:.2f}"),
    ("over_spread_share", "over-spread\njobs", "{:.1%}"),
    ("mean_comm_slowdown", "comm\nslowdown", "{:.2f}x"),
    ("allocation_ratio", "allocation\nratio", "{:.2%}"),
    ("running_ratio", "running\nratio", "{:.2%}"),
    ("waiting_share", "time jobs\nwaited", "{:.0%}"),
    ("saturated_allocation_ratio", "allocation\nwhile jobs wait", "{:.2%}"),
    ("straggler_gpu_hours", "straggler\nGPU-h", "{:.1f}"),
)


def aggregate(results: Sequence[RunMetrics]) -> list[dict[str, float | str | int]]:
    """Mean over seeds per (scenario, scheduler), in the order first seen; the allocation while jobs wait pooled
    over the seeds' waiting time."""
    groups: dict[tuple[bool, str], list[dict[str, float | int | str | bool]]] = {}
    runs: dict[tuple[bool, str], list[RunMetrics]] = {}
    for r in results:
        groups.setdefault((r.thermal, r.scheduler), []).append(r.summary())
        runs.setdefault((r.thermal, r.scheduler), []).append(r)
    out: list[dict[str, float | str | int]] = []
    for (thermal, name), rows in groups.items():
        row: dict[str, float | str | int] = {
            "scenario": "thermal" if thermal else "base",
            "scheduler": name,
            "seeds": len(rows),
            "jobs": int(rows[0]["jobs"]),
        }
        for key, _, _ in COLUMNS:
            row[key] = mean(float(x[key]) for x in rows)
        # pooled over the seeds' waiting time: a seed in which no job waited adds nothing (its mean would be NaN)
        waited = sum(r.capacity_gpus * r.waiting_s for r in runs[thermal, name])
        sat = sum(r.waiting_gpu_s for r in runs[thermal, name]) / waited if waited > 0 else float("nan")
        row["saturated_allocation_ratio"] = sat
        row["straggler_moves"] = mean(float(x["straggler_moves"]) for x in rows)
        row["seconds"] = mean(float(x["seconds"]) for x in rows)
        out.append(row)
    return out


def _cell(fmt: str, v: float) -> str:
    return "-" if math.isnan(v) else fmt.format(v)


def table(rows: Sequence[dict[str, float | str | int]], title: str) -> Table:
    t = Table(title=title)
    t.add_column("scenario")
    t.add_column("scheduler")
    for _, head, _ in COLUMNS:
        t.add_column(head, justify="right")
    t.add_column("sim s", justify="right")
    for r in rows:
        t.add_row(
            str(r["scenario"]),
            str(r["scheduler"]),
            *(_cell(fmt, float(r[k])) for k, _, fmt in COLUMNS),
            f"{float(r['seconds']):.0f}",
        )
    return t


def _allocation_goal(
    name: str, gang: dict[str, float | str | int], other: dict[str, float | str | int], within: float
) -> tuple[str, bool, str]:
    """kelvin-gang's allocation while jobs wait against ``other``'s: met when at most ``within`` pt below it (above
    it when ``within`` is 0). The whole-window figure is given too: it also counts GPU-time of slower jobs."""
    g, o = float(gang["saturated_allocation_ratio"]), float(other["saturated_allocation_ratio"])
    if math.isnan(g) or math.isnan(o):
        return name, False, "not measured: no job waited in the measured window (run more jobs)"
    d = 100 * (g - o)
    whole = 100 * (float(gang["allocation_ratio"]) - float(other["allocation_ratio"]))
    met = d >= -within if within > 0 else d > 0
    return name, met, f"{d:+.2f} pt; over the whole window {whole:+.2f} pt"


def goals(rows: Sequence[dict[str, float | str | int]]) -> list[tuple[str, bool, str]]:
    """The issue's goals, each (what, met, the figures)."""
    by = {(str(r["scenario"]), str(r["scheduler"])): r for r in rows}
    out: list[tuple[str, bool, str]] = []
    base_gang, base_pod, base_tas = (
        by.get(("base", "kelvin-gang")),
        by.get(("base", "kelvin-pod")),
        by.get(("base", "tas-greedy")),
    )
    if base_gang is not None:
        v = float(base_gang["incomplete_gang_gpu_hours"])
        out.append(("kelvin-gang holds no GPU for incomplete gangs", v == 0.0, f"{v:.1f} GPU-h"))
    for other, what, within in (
        (base_pod, "within 0.5 pt of kelvin per pod", 0.5),
        (base_tas, "above the TAS-like greedy", 0.0),
    ):
        if base_gang is not None and other is not None:
            out.append(_allocation_goal(f"allocation while jobs wait {what}", base_gang, other, within))
    th_gang, th_tas = by.get(("thermal", "kelvin-gang")), by.get(("thermal", "tas-greedy"))
    if th_gang is not None and th_tas is not None:
        g, t = float(th_gang["straggler_gpu_hours"]), float(th_tas["straggler_gpu_hours"])
        cut = 1.0 - g / t if t > 0 else 0.0
        out.append(("straggler GPU-h at least 80 % below the TAS-like greedy", cut >= 0.8, f"{cut:.0%} less"))
    return out


def json_rows(rows: Sequence[dict[str, float | str | int]]) -> list[dict[str, float | str | int | None]]:
    """The rows for JSON: a figure not measured (NaN, e.g. the allocation while jobs wait when none waited) is null."""
    return [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]


def write_csv(rows: Sequence[dict[str, float | str | int]], path: Path) -> None:
    buf = io.StringIO()
    keys = ["scenario", "scheduler", "seeds", "jobs", *(k for k, _, _ in COLUMNS), "seconds"]
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buf.getvalue(), encoding="utf-8")


def write_png(rows: Sequence[dict[str, float | str | int]], path: Path, title: str = "") -> None:
    """One bar panel per metric, schedulers side by side, the base and thermal scenarios as two bar groups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(str(r["scenario"]) for r in rows))
    schedulers = list(dict.fromkeys(str(r["scheduler"]) for r in rows))
    fig, axes = plt.subplots(2, 5, figsize=(20, 7))
    width = 0.8 / max(len(schedulers), 1)
    for ax, (key, head, _) in zip(axes.flat, COLUMNS, strict=True):
        for k, s in enumerate(schedulers):
            ys = [
                next((float(r[key]) for r in rows if r["scheduler"] == s and r["scenario"] == sc), 0.0)
                for sc in scenarios
            ]
            ax.bar([i + k * width for i in range(len(scenarios))], ys, width, label=s)
        ax.set_xticks([i + width * (len(schedulers) - 1) / 2 for i in range(len(scenarios))], scenarios)
        ax.set_title(head.replace("\n", " "), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
