"""A clone of the public repository has no ../shared (README.md, Test data): every test that reads it finds it through
the fixtures of tests/conftest.py, and without it skips with the reason instead of failing or erroring."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = ("shared_dir", "fixtures_dir", "traces_dir", "capture")
# the one place each of tests/ and bench/ says where ../shared is
ALLOWED = {ROOT / "tests" / "conftest.py", ROOT / "bench" / "harness.py", Path(__file__).resolve()}
_HAND_BUILT = re.compile(r"""/\s*["']shared["']|environ.*KELVIN_SHARED_DIR|parents\[\d\]\.parent""")

# a pytest plugin that keeps only the tests using a fixture of ../shared
_ONLY_SHARED = f"""
def pytest_collection_modifyitems(config, items):
    keep = [i for i in items if set(getattr(i, "fixturenames", ())) & {set(SHARED_FIXTURES)!r}]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep
"""


def test_no_test_or_benchmark_builds_the_path_to_shared_itself() -> None:
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*.py")]
    found = [
        f"{f.relative_to(ROOT)}:{n}: {line.strip()}"
        for f in files
        if f not in ALLOWED
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if _HAND_BUILT.search(line)
    ]
    use = "use the shared_dir / fixtures_dir / traces_dir fixtures (or bench/harness.SHARED)"
    assert not found, use + ":\n" + "\n".join(found)


@pytest.mark.slow
def test_without_shared_every_test_that_needs_it_skips_with_the_reason(tmp_path: Path) -> None:
    users = sorted(
        str(f.relative_to(ROOT))
        for f in (ROOT / "tests").rglob("test_*.py")
        if f != Path(__file__) and re.search(r"\b(" + "|".join(SHARED_FIXTURES) + r")\b", f.read_text())
    )
    assert len(users) >= 5, users
    (tmp_path / "only_shared.py").write_text(_ONLY_SHARED)
    empty = tmp_path / "shared"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "PYTEST_ADDOPTS"}}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    env["KELVIN_SHARED_DIR"] = str(empty)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "only_shared", "-p", "no:cacheprovider", *users]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1]
    assert proc.returncode == 0, out
    assert re.fullmatch(r"=* ?\d+ skipped, \d+ deselected.*", summary), summary
    reasons = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    shared = [r for r in reasons if f"shared material not found: no {empty}" in r]
    # a test may skip first for a tool this machine lacks (helm, prometheus: tests/conftest.py's _tool)
    assert len(shared) >= 5 and all(r in shared or "is not installed" in r for r in reasons), reasons
