"""Helpers of the deployment checks (tests/deploy): render the chart with the real helm binary, load the output."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kelvin"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "kelvin"
NAMESPACE = "kelvin-system"
# The Kubernetes version the rendered objects are validated against (kubernetes-validate's bundled schemas); the
# chart's default kube-scheduler image is v1.32.6, and the chart supports 1.28 and later.
K8S_VERSION = "1.32"
# The API group/version of the Prometheus Operator's CRDs: the chart renders ServiceMonitor/PrometheusRule only when the
# cluster serves it (helm template: --api-versions).
PROMETHEUS_OPERATOR_API = "monitoring.coreos.com/v1"

Doc = dict[str, Any]
Render = Callable[..., list[Doc]]


def cel(pod: Doc) -> Callable[[str], bool]:
    """An evaluator of CEL expressions over ``object = pod``, as the API server runs matchConditions and admission
    policies (cel-python). An evaluation error (a non-bool) fails the test: on the API server it would call (or, with
    failurePolicy Fail, deny) every matching pod."""
    import json

    import celpy  # type: ignore[import-untyped]

    env = celpy.Environment()
    activation = {"object": celpy.json_to_cel(json.loads(json.dumps(pod)))}

    def run(expr: str) -> bool:
        r = env.program(env.compile(expr)).evaluate(activation)
        assert isinstance(r, celpy.celtypes.BoolType), f"evaluation error {r!r} in {expr}"
        return bool(r)

    return run


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def load_docs(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs: Sequence[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: Sequence[Doc], kind: str, name_part: str = "") -> Doc:
    found = [d for d in by_kind(docs, kind) if name_part in d["metadata"]["name"]]
    assert len(found) == 1, f"expected one {kind} named *{name_part}*, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]
    if doc["kind"] == "Pod":
        return spec
    if doc["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return spec["template"]["spec"]  # type: ignore[no-any-return]
