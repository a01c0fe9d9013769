"""Every benchmark script starts: its imports resolve against the current code and it answers ``--help``.

A benchmark nobody runs in CI rots silently when the code it imports moves (bench/operator_cycle.py imported a
function that had moved to model/times.py); this keeps each one at least importable and its CLI readable.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name != "harness.py")


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_benchmark_answers_help(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower(), done.stdout[:500]
    assert "Traceback" not in done.stderr


def test_thermal_table_says_on_how_many_seeds_the_operator_goal_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thermal table's caption counts the seeds where kelvin+operator's throttled time plus eviction cost is at
    least 90 % below the default's, and names the others (the goal is judged per seed as well as on the means)."""
    import io

    from rich.console import Console

    from scheduler_plugin.simulator.thermal import ThermalScenario, run_thermal

    monkeypatch.syspath_prepend(str(BENCH))
    import placement_quality

    seeds, hours = [3, 4], 0.25
    table = placement_quality.thermal_table(seeds, hours, Console(file=io.StringIO()))
    met = []
    for s in seeds:
        sc = ThermalScenario(hours=hours, seed=s)
        met.append(
            run_thermal(sc, "kelvin+operator").cost_gpu_minutes <= 0.1 * run_thermal(sc, "default").cost_gpu_minutes
        )
    missed = ", ".join(str(s) for s, ok in zip(seeds, met, strict=True) if not ok) or "none"
    assert f"on {sum(met)} of 2 seeds; missed on {missed}" in str(table.caption)
    assert table.row_count == 6  # the well-cooled reference and the five arms
