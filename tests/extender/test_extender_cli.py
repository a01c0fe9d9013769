"""``kelvin extender`` / ``explain`` / ``demo`` through the CLI (typer's runner; the demo runs a real server)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import typer
from ext_helpers import make_extender, pod
from typer.testing import CliRunner

from scheduler_plugin.demo.driver import Demo
from scheduler_plugin.demo.summary import fleet_state
from scheduler_plugin.extender import cli
from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.server import ServerThread
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, SimulatedFleetSource

app = typer.Typer()
app.command("extender")(cli.extender)
app.command("explain")(cli.explain)
app.command("demo")(cli.demo)
runner = CliRunner()


@pytest.mark.parametrize(
    ("argv", "env", "words"),
    [
        ([], {"KELVIN_PORT": "70000"}, "port (KELVIN_PORT): Input should be less than or equal to 65535"),
        (["--fleet-nodes", "0"], {}, "fleet_nodes (KELVIN_FLEET_NODES)"),
        ([], {"KELVIN_SOURCE": "carrier-pigeon"}, "source (KELVIN_SOURCE)"),
        (["--policy-file", "{bad}"], {}, "scoring.thermal.weight"),
        (["--policy-file", "/nonexistent/policy.yaml"], {}, "cannot read the policy file"),
        (["--fleet-file", "{fleet}"], {}, "groups.0.topology"),
        ([], {"KELVIN_PROMETHEUS_URL": "http://prom:9090/api/v1/query"}, "prometheus_url (KELVIN_PROMETHEUS_URL)"),
        ([], {"KELVIN_PROMETHEUS_URL": "http://prom :9090"}, "must be an http(s) URL with a host"),
        (
            [],
            {"KELVIN_REFRESH_INTERVAL_S": "120"},
            "max_telemetry_age_s (KELVIN_MAX_TELEMETRY_AGE_S): 30 s must be more than refresh_interval_s",
        ),
    ],
)
def test_bad_config_stops_startup_naming_the_field(
    tmp_path: Path, argv: list[str], env: dict[str, str], words: str
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("scoring:\n  thermal: {weight: -1}\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("groups: [{count: 2, topology: torus}]\n")
    argv = [a.format(bad=bad, fleet=fleet) for a in argv]
    result = runner.invoke(app, ["extender", *argv], env=env)
    assert result.exit_code == 2
    assert "configuration error" in result.output and words in result.output
    assert "Traceback" not in result.output


@pytest.fixture
def pod_file(tmp_path: Path) -> Path:
    p = tmp_path / "pod.yaml"
    p.write_text(json.dumps(pod("train", gpus=2)))
    return p


def test_explain_offline(pod_file: Path) -> None:
    result = runner.invoke(app, ["explain", str(pod_file), "gpu-node-2", "--fleet-nodes", "6", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["node"] == "gpu-node-2" and data["request"] == "2 whole GPUs"
    # the thermal policy holds a pod from a node where it would throttle (holdRunSeconds): a filter too
    assert [f["filter"] for f in data["filters"]] == ["telemetry", "fit", "hotness", "thermal"]
    text = runner.invoke(app, ["explain", str(pod_file), "gpu-node-2", "--fleet-nodes", "6"])
    assert text.exit_code == 0 and "filter fit" in text.output
    missing = runner.invoke(app, ["explain", str(pod_file), "gpu-node-99", "--fleet-nodes", "6"])
    assert missing.exit_code == 1 and "'gpu-node-99' is not in kelvin's snapshot" in missing.output


def test_explain_against_a_running_extender(pod_file: Path) -> None:
    ext, _, _ = make_extender()
    with ServerThread(create_app(ext)) as url:
        result = runner.invoke(app, ["explain", str(pod_file), "gpu-node-2", "--url", url, "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["fits"] is True
        bad = runner.invoke(app, ["explain", str(pod_file), "nope", "--url", url])
        assert bad.exit_code == 1 and "HTTP 400" in bad.output
    down = runner.invoke(app, ["explain", str(pod_file), "n", "--url", url])
    assert down.exit_code == 1 and "cannot reach the extender" in down.output


def test_explain_bad_pod_file(tmp_path: Path) -> None:
    f = tmp_path / "pod.yaml"
    f.write_text("- not a pod\n")
    result = runner.invoke(app, ["explain", str(f), "gpu-node-1"])
    assert result.exit_code == 2 and "must hold one Pod object" in result.output


def test_explain_takes_a_workloads_pod_template() -> None:
    root = Path(__file__).resolve().parents[2]
    result = runner.invoke(
        app, ["explain", str(root / "manifests/examples/shared-gpu-inference.yaml"), "gpu-node-1", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["request"] == "a share of one GPU (20 GiB, 30% of compute)", out["request"]


def test_explain_rejects_an_object_without_a_pod(tmp_path: Path) -> None:
    f = tmp_path / "svc.yaml"
    f.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    result = runner.invoke(app, ["explain", str(f), "gpu-node-1"])
    assert result.exit_code == 2 and "kind 'Service' has no pod to explain" in result.output
    g = tmp_path / "deploy.yaml"
    g.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n")
    result = runner.invoke(app, ["explain", str(g), "gpu-node-1"])
    assert result.exit_code == 2 and "no pod template at spec.template" in result.output


def test_demo_runs_end_to_end() -> None:
    result = runner.invoke(app, ["demo", "--pods", "30", "--nodes", "6", "--interval", "0", "--no-live"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "kelvin demo summary" in out and "placed" in out and "GPUs stranded" in out
    assert "30/30 pods" in out


def test_demo_places_pods_over_http_and_loads_the_fleet() -> None:
    demo = Demo(pods=25, nodes=6, gpus=8, seed=3, interval_s=0.0)
    summary = demo.run(live=False)
    assert summary.placed + summary.failed == 25 and summary.placed > 10
    placed = [r for r in summary.rows if r.node]
    assert all(r.gpus for r in placed)
    keys = set(demo.source.placements())
    finished = summary.finished
    assert len([k for k in keys if k.startswith("demo/")]) == summary.placed - finished


def test_fleet_state_counts() -> None:
    src = SimulatedFleetSource(FleetSpec.uniform(4, 8, seed=0, initial_load=0.0))
    from scheduler_plugin.model import Snapshot

    snap = Snapshot(tuple(src.snapshot_nodes()), taken_at=time.time())
    stranded, stranded_bytes, whole, throttling = fleet_state(snap)
    assert (stranded, stranded_bytes, whole, throttling) == (0, 0, 32, 0)


def test_unknown_kelvin_variables_are_named() -> None:
    from scheduler_plugin.settings import unknown_env_vars

    env = {"KELVIN_PROMETEUS_URL": "x", "KELVIN_PORT": "1", "KELVIN_OPERATOR_DRY_RUN": "true", "HOME": "/"}
    assert unknown_env_vars(env) == ["KELVIN_PROMETEUS_URL"]
