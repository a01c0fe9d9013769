"""Shared helpers of the extender tests: a static telemetry source with nodes shaped like the captures' nodes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduler_plugin.extender.app import build_extender
from scheduler_plugin.extender.binder import Binder
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.model import GIB, GpuAssignment, GpuInfo, GpuNode
from scheduler_plugin.policies.policy_file import PolicyConfig
from scheduler_plugin.settings import Settings
from scheduler_plugin.telemetry.source import SourceError


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def gpu_node(name: str, busy: Sequence[int] = (), temp: float = 45.0, hot: Sequence[int] = ()) -> GpuNode:
    """An 8 x H100 80 GB NVSwitch node (the captures' nodes allocate ``nvidia.com/gpu: 8``)."""
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model="H100-SXM-80GB",
            memory_total_bytes=80 * GIB,
            memory_used_bytes=70 * GIB if i in busy else GIB // 2,
            temperature_celsius=91.0 if i in hot else (temp + 20 if i in busy else temp),
            slowdown_celsius=87.0,
            shutdown_celsius=92.0,
            sm_clock_mhz=1980.0,
            sm_clock_max_mhz=1980.0,
            utilization=0.9 if i in busy else 0.0,
            numa_node=i // 4,
            pcie_switch=f"sw{i // 2}",
            nvlink_peers=frozenset(j for j in range(8) if j != i),
        )
        for i in range(8)
    )
    assignments = tuple(GpuAssignment(pod_key=f"other/{name}-{i}", gpu_indices=(i,)) for i in busy)
    return GpuNode(
        name=name, gpus=gpus, cpu_allocatable_milli=64_000, memory_allocatable_bytes=512 * GIB, assignments=assignments
    )


def capture_nodes() -> list[GpuNode]:
    """gpu-node-1 with 6 busy GPUs, gpu-node-2 with 1: both pass a 1-GPU pod, node 2 scores higher."""
    return [gpu_node("gpu-node-1", busy=range(6)), gpu_node("gpu-node-2", busy=[0])]


class StaticSource:
    """Returns fixed nodes stamped with the clock's time; ``fail`` makes fetch raise; ``frozen_at`` pins
    ``observed_at`` (telemetry that stopped updating)."""

    name = "static"

    def __init__(self, nodes: Sequence[GpuNode], clock: Clock) -> None:
        self.nodes = list(nodes)
        self.clock = clock
        self.fail = False
        self.frozen_at: float | None = None
        self.fetches = 0
        self.bound: list[tuple[str, GpuAssignment]] = []

    async def fetch(self) -> Sequence[GpuNode]:
        self.fetches += 1
        if self.fail:
            raise SourceError("static source is down (test)")
        at = self.clock() if self.frozen_at is None else self.frozen_at
        return [replace(n, observed_at=at) for n in self.nodes]

    async def close(self) -> None:
        return None


def make_extender(
    nodes: Sequence[GpuNode] | None = None,
    *,
    on_stale: str = "deny",
    clock: Callable[[], float] | None = None,
    binder: Binder | None = None,
    source: Any = None,
    **settings: Any,
) -> tuple[Extender, Any, Any]:
    """An extender over ``nodes`` (default: the captures' two nodes) or ``source``; the clock defaults to a
    :class:`Clock` (pass ``time.time`` with a simulated source, whose telemetry carries real time)."""
    clock = clock or Clock()
    if source is not None:
        src = source
    else:
        assert isinstance(clock, Clock)
        src = StaticSource(nodes if nodes is not None else capture_nodes(), clock)
    policy = PolicyConfig.from_mapping({"telemetry": {"onStale": on_stale, "maxAgeSeconds": 30}})
    ext = build_extender(
        Settings(refresh_interval_s=3600, **settings), policy=policy, source=src, binder=binder, clock=clock
    )
    return ext, src, clock


def pod(name: str = "p1", gpus: int = 1, annotations: dict[str, str] | None = None, uid: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid or f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
    }


def args(p: dict[str, Any], names: Sequence[str] = ("gpu-node-1", "gpu-node-2")) -> bytes:
    return json.dumps({"Pod": p, "Nodes": None, "NodeNames": list(names)}).encode()


def load_capture(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
