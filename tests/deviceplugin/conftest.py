"""Fixtures of the device-plugin tests: a short socket folder (unix socket paths are limited to 107 bytes)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler_plugin.nvml.fake import FakeNvml


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kdp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    nvml = FakeNvml(4, "H100-SXM-80GB", seed=7)
    nvml.nvmlInit()
    yield nvml
