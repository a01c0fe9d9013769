"""Fixtures of the deployment checks; the helpers live in deploy_helpers.py (a unique module name)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# the helpers are imported by name from the test modules: make that work under any pytest --import-mode
sys.path.insert(0, str(Path(__file__).resolve().parent))
from deploy_helpers import CHART, NAMESPACE, RELEASE, Doc, Render, load_docs, run_helm


@pytest.fixture(scope="session")
def render(helm_bin: str) -> Render:
    """render(values_file=None, *sets, crds=False) -> the rendered objects (cached per arguments)."""
    cache: dict[tuple[Any, ...], list[Doc]] = {}

    def _render(values: Path | None = None, *sets: str, crds: bool = False) -> list[Doc]:
        key = (values, sets, crds)
        if key not in cache:
            args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
            if values is not None:
                args += ["-f", str(values)]
            for s in sets:
                args += ["--set", s]
            if crds:
                args.append("--include-crds")
            cache[key] = load_docs(run_helm(helm_bin, *args).stdout)
        return cache[key]

    return _render
