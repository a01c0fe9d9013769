"""``kelvin simulate`` end to end on a small trace: table, CSV, PNG, --json, and readable errors."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scheduler_plugin.cli import app
from scheduler_plugin.simulator.engine import prepare, run
from scheduler_plugin.simulator.policies import build_policy
from scheduler_plugin.simulator.trace import load_trace

runner = CliRunner()


@pytest.mark.slow
def test_simulate_writes_table_curve_plot_and_json(small_trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = small_trace
    out = tmp_path / "out"
    res = runner.invoke(
        app,
        [
            "simulate",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--policy",
            "fgd",
            "--policy",
            "best-fit",
            "--seed",
            "1",
            "--seed",
            "2",
            "--out",
            str(out),
            "--json",
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc["policies"]) == {"fgd", "best-fit"}
    runs = doc["policies"]["fgd"]["runs"]
    assert [r["seed"] for r in runs] == [1, 2]
    assert set(runs[0]["alloc_pct"]) == {"100", "110", "120", "130"}
    assert "unallocated_gpus_at_100" in runs[0] and "first_failure" in runs[0]
    rows = list(csv.reader((out / "curve.csv").open()))
    assert rows[0][:4] == ["policy", "seed", "total_gpus", "0"] and len(rows) == 5 and len(rows[1]) == 134
    assert (out / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_simulate_reports_bad_input_without_a_traceback(small_trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, _ = small_trace
    pods = tmp_path / "bad.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1000,1,x,1000,\n")
    res = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--no-progress"])
    assert res.exit_code == 2
    assert "row 2, column 'num_gpu'" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(nodes), "--policy", "nope"])
    assert res.exit_code == 2 and "unknown policy 'nope'" in res.output


@pytest.mark.slow
def test_simulate_thermal_json() -> None:
    res = runner.invoke(app, ["simulate", "--thermal", "--hours", "0.25", "--seed", "5", "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["thermal"]
    assert [r["policy"] for r in rows] == [
        "default",
        "kelvin-no-thermal",
        "kelvin",
        "kelvin+operator",
        "kelvin+operator-warm",
    ]
    assert all(r["seed"] == 5 and r["placements"] > 0 and r["useful_gpu_hours"] > 0 for r in rows)


def test_simulate_needs_nodes_and_pods_without_thermal() -> None:
    res = runner.invoke(app, ["simulate", "--no-progress"])
    assert res.exit_code == 2 and "--nodes and --pods are required" in res.output


def test_simulate_learned_workload_is_reported(small_trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = small_trace
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path), "--json", "--no-progress"]
    res = runner.invoke(app, [*args, "--learn-workload"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["workload"] == "learned"
    assert "target workload: learned from the arrivals" in res.stderr
    res = runner.invoke(app, args)
    assert json.loads(res.stdout)["workload"] == "trace"


def test_progress_counts_the_arrived_workload_not_pods(small_trace: tuple[Path, Path], tmp_path: Path) -> None:
    """Before: "491/491" (arrivals, known in advance) for a "1900 pods" workload. The bar counts what the protocol
    stops on, the arrived % of GPU capacity, and the table says how many pods arrived."""
    nodes, pods = small_trace
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path)]
    res = runner.invoke(app, args, env={"COLUMNS": "240"})
    assert res.exit_code == 0, res.output
    assert "7 pods" in res.stderr
    assert "130/130 % of GPU capacity arrived" in res.stderr
    r = run(prepare(load_trace(nodes, pods)), build_policy("kelvin", 42), 42)
    header, row = (ln for ln in res.stdout.splitlines() if "policy" in ln or "kelvin" in ln)
    cells = dict(zip((c.strip() for c in header.split("┃")), (c.strip() for c in row.split("│")), strict=True))
    assert cells["arrivals"] == str(len(r.arrived_pct)) != "7"


def test_default_out_is_simulate_out_in_the_current_directory_and_git_ignores_it(
    small_trace: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes, pods = small_trace
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--no-progress"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "simulate-out"
    assert (out / "curve.csv").is_file() and (out / "curve.png").is_file()
    assert str(out / "curve.csv") in res.stdout.replace("\n", "")  # where it went, as an absolute path
    root = Path(__file__).parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    check = subprocess.run(["git", "check-ignore", "-q", "simulate-out/curve.csv"], cwd=root, check=False)
    assert check.returncode == 0, ".gitignore does not cover simulate-out/"
    assert "default `simulate-out/` in the current directory" in (root / "docs" / "simulator.md").read_text()
