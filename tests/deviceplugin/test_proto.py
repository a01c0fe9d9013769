"""The committed device-plugin stubs are what hack/gen-deviceplugin-proto.sh generates from api.proto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = Path("scheduler_plugin/deviceplugin/v1beta1")


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) regenerates the stubs")
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(ROOT / "hack/gen-deviceplugin-proto.sh"), str(tmp_path)], check=True, env=env, timeout=120
    )
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        fresh = (tmp_path / PKG / name).read_text()
        assert fresh == (ROOT / PKG / name).read_text(), f"{PKG / name} is stale: run hack/gen-deviceplugin-proto.sh"


def test_wire_names_match_the_kubelet() -> None:
    """The kubelet calls /v1beta1.Registration/Register and /v1beta1.DevicePlugin/<method>: the names must match."""
    from scheduler_plugin.deviceplugin.v1beta1 import api_pb2 as pb

    services = pb.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    fields = {f.name: f.number for f in pb.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    assert {f.name: f.number for f in pb.Device.DESCRIPTOR.fields} == {"ID": 1, "health": 2, "topology": 3}
