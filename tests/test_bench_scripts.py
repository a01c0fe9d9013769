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
