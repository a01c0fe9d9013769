"""Fixtures of the deployment checks; the helpers live in deploy_helpers.py (a unique module name)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# the helpers are imported by name from the test modules: make that work under any pytest --import-mode
sys.path.insert(0, str(Path(__file__).resolve().parent))
from deploy_helpers import CHART, NAMESPACE, PROMETHEUS_OPERATOR_API, RELEASE, Doc, Render, load_docs, run_helm


@pytest.fixture(scope="session")
def render(helm_bin: str) -> Render:
    """render(values_file=None, *sets, crds=False, api_versions=(PROMETHEUS_OPERATOR_API,)) -> the rendered objects
    (cached per arguments). The cluster is assumed to serve the Prometheus Operator's API unless api_versions says
    otherwise: the monitoring templates render only then."""
    cache: dict[tuple[Any, ...], list[Doc]] = {}

    def _render(
        values: Path | None = None,
        *sets: str,
        crds: bool = False,
        api_versions: tuple[str, ...] = (PROMETHEUS_OPERATOR_API,),
    ) -> list[Doc]:
        key = (values, sets, crds, api_versions)
        if key not in cache:
            args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
            if values is not None:
                args += ["-f", str(values)]
            for s in sets:
                args += ["--set", s]
            for api in api_versions:
                args += ["--api-versions", api]
            if crds:
                args.append("--include-crds")
            cache[key] = load_docs(run_helm(helm_bin, *args).stdout)
        return cache[key]

    return _render
