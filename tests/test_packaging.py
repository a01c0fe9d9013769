"""Packaging: the license as an SPDX expression (PEP 639) and a build without setuptools deprecation warnings;
starlette's TestClient on httpx2, its supported transport, so that no test run warns about it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: The one setuptools warning tolerated, and only while LICENSE is absent (it is added on another branch).
NO_LICENSE_FILE = "Pattern 'LICENSE' did not match any files"


def test_the_license_is_an_spdx_expression_with_its_file() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"  # a string: the {text = ...} table is deprecated by setuptools
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]  # PEP 639: not both
    (setuptools,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert Version("76.1") not in setuptools.specifier and Version("77.0") in setuptools.specifier


def test_starlettes_test_client_imports_without_a_deprecation_warning() -> None:
    # a fresh interpreter: the warning is emitted once, when starlette.testclient is first imported
    warning = "error:Using `httpx` with `starlette.testclient` is deprecated:UserWarning"
    res = subprocess.run(
        [sys.executable, "-W", warning, "-c", "import fastapi.testclient"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    test_extra = [Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"]["test"]]
    assert "httpx2" in test_extra
    assert any("starlette.testclient" in f and f.startswith("error:") for f in _filterwarnings())


def _filterwarnings() -> list[str]:
    return list(PYPROJECT["tool"]["pytest"]["ini_options"]["filterwarnings"])


@pytest.mark.slow
def test_the_wheel_builds_without_setuptools_deprecation_warnings(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: setuptools writes build/ and *.egg-info next to pyproject.toml
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("scheduler_plugin", "operator"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-v", "-w", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    warnings = [m.start() for m in re.finditer(r"SetuptoolsDeprecationWarning", out)]
    unexpected = [
        out[i : i + 300] for i in warnings if (ROOT / "LICENSE").exists() or NO_LICENSE_FILE not in out[i : i + 300]
    ]
    assert not unexpected, "\n---\n".join(unexpected)
    (wheel,) = (tmp_path / "dist").glob("kelvin-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        text = whl.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text.splitlines()
    if (ROOT / "LICENSE").exists():
        assert "License-File: LICENSE" in text.splitlines()
