"""The Grafana dashboards: valid JSON for the Grafana sidecar, a $datasource variable, only documented metric names,
and EVERY panel query returns data from a real Prometheus scraping the real kelvin processes.

The live test starts on 127.0.0.1 (free ports, temporary storage, 1 s scrape interval):
- ``kelvin exporter --fake`` (exporter metrics),
- ``kelvin extender`` on its simulated fleet with the chart's default policy, after a few filter/prioritize/bind
  requests built from a real kube-scheduler capture (extender and telemetry metrics),
- the operator's metrics registry (``kelvin_operator.metrics.OperatorMetrics``) served in-process with
  prometheus_client: the operator itself needs a Kubernetes API to run,
then Prometheus, and runs every panel's PromQL with the Grafana variables replaced by concrete values.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from deploy_helpers import CHART, ROOT

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
METRICS_DOC = ROOT / "docs" / "metrics.md"
NODE = "gpu-node-1"  # the exporter's node name; the $node variable is set to it
VARIABLES = {"$__rate_interval": "1m", "$__range": "1m", "${node}": NODE, "$node": NODE}
CLI = "from scheduler_plugin.cli import app; app()"
# panel plugins that ship with Grafana (no plugin installation needed)
GRAFANA_CORE_PANELS = {"timeseries", "stat", "gauge", "bargauge", "heatmap", "piechart", "table", "text"}
# the dashboards whose panels must show numbers, not only NaN (their processes served real requests)
MUST_BE_FINITE = {"kelvin-fleet.json", "kelvin-scheduling.json"}


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return [p for p in out if p["type"] != "row"]


def _queries() -> list[tuple[str, str, str]]:
    return [
        (path.name, panel["title"], target["expr"])
        for path in DASHBOARDS
        for panel in _panels(_load(path))
        for target in panel["targets"]
    ]


def documented_metrics() -> set[str]:
    """Metric names of docs/metrics.md's tables, with `a_total_bytes` / `_used_bytes` shorthands expanded."""
    names: set[str] = set()
    for line in METRICS_DOC.read_text().splitlines():
        if not line.startswith("| `kelvin_"):
            continue
        first_cell = line.split("|")[1]
        found = re.findall(r"`(_?[a-z0-9_]+)`", first_cell)
        base = found[0]
        names.add(base)
        for short in found[1:]:
            if short.startswith("_"):
                parts = short.strip("_").split("_")
                names.add("_".join(base.split("_")[: -len(parts)]) + short)
            else:
                names.add(short)
        if "| histogram |" in line:
            names |= {f"{n}_{s}" for n in list(names) if n.startswith(base) for s in ("bucket", "sum", "count")}
    return names


def test_dashboards_are_sidecar_ready_with_a_datasource_variable() -> None:
    assert {p.name for p in DASHBOARDS} == {"kelvin-fleet.json", "kelvin-scheduling.json", "kelvin-operator.json"}
    uids = set()
    for path in DASHBOARDS:
        d = _load(path)
        uids.add(d["uid"])
        (ds,) = [v for v in d["templating"]["list"] if v["name"] == "datasource"]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        panels = _panels(d)
        assert len(panels) >= 4, path.name
        assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
        for p in panels:
            assert p["type"] in GRAFANA_CORE_PANELS, (path.name, p["title"], p["type"])
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (path.name, p["title"])
            assert p["targets"], (path.name, p["title"])
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip()
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert v["datasource"]["uid"] == "${datasource}"
    assert len(uids) == len(DASHBOARDS)


def test_dashboards_cover_what_the_issue_asks() -> None:
    titles = {path.name: {p["title"].lower() for p in _panels(_load(path))} for path in DASHBOARDS}
    fleet = " ".join(titles["kelvin-fleet.json"])
    assert all(w in fleet for w in ("heatmap", "memory used by gpu", "throttled", "stranded"))
    sched = " ".join(titles["kelvin-scheduling.json"])
    assert all(w in sched for w in ("decisions", "rejections by reason", "latency"))
    oper = " ".join(titles["kelvin-operator.json"])
    assert all(w in oper for w in ("taint", "evictions", "handshake", "pool violations"))
    heatmaps = [p for p in _panels(_load(CHART / "dashboards" / "kelvin-fleet.json")) if p["type"] == "heatmap"]
    assert heatmaps and "kelvin_gpu_temperature_celsius" in heatmaps[0]["targets"][0]["expr"]


def test_queries_and_alerts_use_only_documented_metrics() -> None:
    documented = documented_metrics()
    assert {"kelvin_gpu_memory_used_bytes", "kelvin_extender_request_duration_seconds_bucket"} <= documented
    rules = yaml.safe_load((CHART / "rules" / "kelvin-alerts.yaml").read_text())
    exprs = [e for _, _, e in _queries()] + [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\bkelvin_[a-z0-9_]+", e)}
    assert used and not used - documented, f"not in docs/metrics.md: {sorted(used - documented)}"


# ------------------------------------------------------------------------------------------------ live Prometheus


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"{proc.args!r} exited with {proc.returncode} before {url} answered:\n{out[-3000:]}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"{url} did not answer within {timeout_s:.0f} s")


@dataclass
class Stack:
    prometheus: str
    jobs: dict[str, str]


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)


def _drive_extender(url: str, fixtures_dir: Path) -> int:
    """Filter, prioritize and bind a few pods (a real kube-scheduler request, varied) on the simulated fleet."""
    from scheduler_plugin.simulator.simulated_fleet import SimulatedFleetSource

    nodes = SimulatedFleetSource.uniform(8).node_names  # the extender's fleet: --fleet-nodes 8, other defaults
    captured = json.loads((fixtures_dir / "filter-nodecache-true-ok-001.json").read_text())["request"]
    variants: list[tuple[dict[str, str], int]] = [
        ({}, 1),
        ({"kelvin.dev/topology": "nvlink-required"}, 8),
        ({"kelvin.dev/gpu-memory": "20Gi"}, 1),
        ({"kelvin.dev/max-temperature": "30"}, 1),
        ({"kelvin.dev/gpu-models": "A100"}, 1),
    ]
    calls = 0
    with httpx.Client(base_url=url, timeout=10.0) as client:
        for i, (annotations, gpus) in enumerate(variants):
            req = copy.deepcopy(captured)
            pod = req["Pod"]
            pod["metadata"]["name"] = f"dash-{i}"
            pod["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
            pod["metadata"]["annotations"] = annotations
            for c in pod["spec"]["containers"]:
                c["resources"] = {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}
            req["Nodes"], req["NodeNames"] = None, nodes
            filtered = client.post("/filter", json=req)
            assert filtered.status_code == 200, filtered.text
            passed = filtered.json().get("NodeNames") or []
            calls += 1
            if len(passed) >= 2:
                scored = client.post("/prioritize", json={**req, "NodeNames": passed})
                assert scored.status_code == 200, scored.text
                calls += 1
            if passed and i == 0:
                bind = {
                    "PodName": "dash-0",
                    "PodNamespace": "default",
                    "PodUID": pod["metadata"]["uid"],
                    "Node": passed[0],
                }
                assert client.post("/bind", json=bind).status_code == 200
                calls += 1
    return calls


@pytest.fixture(scope="module")
def stack(prometheus_bin: str, fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from kelvin_operator.metrics import OperatorMetrics
    from prometheus_client import start_http_server

    tmp = tmp_path_factory.mktemp("prometheus")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]),
    }
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[Any] = []
    try:
        ports = {job: _free_port() for job in ("exporter", "extender", "extender-verbs", "operator", "prometheus")}
        procs.append(
            _spawn(
                [sys.executable, "-c", CLI, "exporter", "--fake", "--fake-gpus", "4", "--host", "127.0.0.1",
                 "--port", str(ports["exporter"]), "--node-name", NODE],
                env,
            )
        )  # fmt: skip
        policy = tmp / "policy.yaml"  # the chart's default policy, as the ConfigMap mounts it
        policy.write_text(yaml.safe_dump(yaml.safe_load((CHART / "values.yaml").read_text())["policy"]))
        procs.append(
            _spawn(
                [sys.executable, "-c", CLI, "extender", "--host", "127.0.0.1", "--port", str(ports["extender-verbs"]),
                 "--metrics-host", "127.0.0.1", "--metrics-port", str(ports["extender"]), "--source", "simulated",
                 "--fleet-nodes", "8", "--refresh-interval", "1", "--policy-file", str(policy),
                 "--log-level", "warning"],
                env,
            )
        )  # fmt: skip
        operator_metrics = OperatorMetrics()
        started = start_http_server(ports["operator"], addr="127.0.0.1", registry=operator_metrics.registry)
        servers.append(started[0] if isinstance(started, tuple) else started)
        jobs = {job: f"127.0.0.1:{ports[job]}" for job in ("exporter", "extender", "operator")}
        for job, proc in zip(("exporter", "extender"), procs, strict=True):
            _wait_http(f"http://{jobs[job]}/metrics", proc)
        _wait_http(f"http://{jobs['operator']}/metrics", None)

        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [
                {"job_name": f"kelvin-{job}", "static_configs": [{"targets": [target]}]} for job, target in jobs.items()
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_url = f"http://127.0.0.1:{ports['prometheus']}"
        procs.append(
            _spawn(
                [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--storage.tsdb.retention.time=1h",
                 "--log.level=warn"],
                env,
            )
        )  # fmt: skip
        _wait_http(f"{prom_url}/-/ready", procs[-1])
        _wait_for_samples(prom_url, 3, minimum=3)
        assert _drive_extender(f"http://127.0.0.1:{ports['extender-verbs']}", fixtures_dir) >= 5
        _wait_for_samples(prom_url, 3, minimum=8)  # several scrapes after the requests: rates have two points
        yield Stack(prometheus=prom_url, jobs=jobs)
    finally:
        for server in servers:
            server.shutdown()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            if proc.stdout:
                proc.stdout.close()


def _query(prom_url: str, expr: str) -> dict[str, Any]:
    resp = httpx.get(f"{prom_url}/api/v1/query", params={"query": expr}, timeout=10.0)
    body: dict[str, Any] = resp.json()
    return body


def _wait_for_samples(prom_url: str, jobs: int, minimum: int, timeout_s: float = 60.0) -> None:
    """Until every job has been scraped successfully at least ``minimum`` times within the last minute."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = _query(prom_url, "sum_over_time(up[1m])").get("data", {}).get("result", [])
        if len(last) == jobs and all(float(r["value"][1]) >= minimum for r in last):
            return
        time.sleep(0.5)
    pytest.fail(f"Prometheus did not scrape {jobs} jobs {minimum} times within {timeout_s:.0f} s: {last}")


def _concrete(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unreplaced Grafana variable in {expr}"
    return expr


@pytest.mark.prometheus
@pytest.mark.slow
def test_every_panel_query_returns_data(stack: Stack) -> None:
    up = _query(stack.prometheus, "up")["data"]["result"]
    assert {r["metric"]["job"]: r["value"][1] for r in up} == {f"kelvin-{j}": "1" for j in stack.jobs}
    empty, failed, nan_only = [], [], []
    queries = _queries()
    assert len(queries) >= 30
    for dashboard, title, expr in queries:
        body = _query(stack.prometheus, _concrete(expr))
        if body.get("status") != "success":
            failed.append(f"{dashboard} / {title}: {body.get('error')} <- {expr}")
            continue
        result = body["data"]["result"]
        if not result:
            empty.append(f"{dashboard} / {title}: {expr}")
        elif dashboard in MUST_BE_FINITE and all(math.isnan(float(r["value"][1])) for r in result):
            nan_only.append(f"{dashboard} / {title}: {expr}")
    assert not failed, "queries Prometheus rejected:\n" + "\n".join(failed)
    assert not empty, "panels with no data:\n" + "\n".join(empty)
    assert not nan_only, "panels with only NaN:\n" + "\n".join(nan_only)


@pytest.mark.prometheus
def test_a_misnamed_metric_would_be_caught(stack: Stack) -> None:
    """The check above can fail: a query naming a metric nobody exports returns nothing."""
    assert _query(stack.prometheus, "kelvin_gpu_temperature_celcius")["data"]["result"] == []
    assert _query(stack.prometheus, _concrete('kelvin_gpu_temperature_celsius{node=~"$node"}'))["data"]["result"]


@pytest.mark.prometheus
def test_every_query_variable_has_values(stack: Stack) -> None:
    """label_values(<series>, <label>) variables (e.g. $node) list something from the same live Prometheus."""
    checked = 0
    for path in DASHBOARDS:
        for var in _load(path)["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
            assert m, f"{path.name}: unsupported variable query {var['definition']}"
            series, label = m.groups()
            result = _query(stack.prometheus, series)["data"]["result"]
            values = {r["metric"].get(label) for r in result} - {None}
            assert values, f"{path.name}: ${var['name']} would be empty"
            if var["name"] == "node":
                assert values == {NODE}
            checked += 1
    assert checked >= 1
