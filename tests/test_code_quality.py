"""The style gates run with the tests, so CI enforces them: ruff (lint + format) and mypy --strict on our packages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_lint_and_format() -> None:
    pytest.importorskip("ruff", reason="ruff not installed (it is in the test extras)")
    lint = _run(sys.executable, "-m", "ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


@pytest.mark.slow
def test_mypy_strict() -> None:
    pytest.importorskip("mypy", reason="mypy not installed (it is in the test extras)")
    out = _run(sys.executable, "-m", "mypy")
    assert out.returncode == 0, out.stdout + out.stderr
