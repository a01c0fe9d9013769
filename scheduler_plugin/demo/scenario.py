"""The demo's scenario: a fleet built to show what a GPU-blind scheduler cannot see, the pod mix streamed through it,
and the GPU-blind baseline it is compared with.

The fleet starts part-full with scattered memory-pool shares (fragmentation) and has poorly cooled nodes that
throttle under load, already hot from a job at full power. The pod stream (shapes and lifetimes) is drawn up front
from the seed alone, so kelvin and the baseline see the very same pods.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..model import GIB
from ..model import annotations as ann
from ..policies.policy_file import PolicyConfig
from ..simulator.simulated_fleet import FleetSpec

#: A node with a GPU within this many degrees of its slowdown threshold (or throttling) counts as hot.
HOT_MARGIN_C = 5.0
#: The smallest GPU memory any pod of the mix asks for; free capacity below it is stranded.
SMALLEST_REQUEST_BYTES = 10 * GIB
#: GPUs of each hot node busy at full power when the demo starts (a pre-existing job kelvin did not place).
HOT_NODE_BUSY_GPUS = 6
#: Where the demo's simulated clock starts (any fixed instant: only differences matter).
DEMO_EPOCH_S = 1_750_000_000.0


@dataclass(frozen=True, slots=True)
class PodShape:
    label: str
    gpus: int
    weight: float
    annotations: tuple[tuple[str, str], ...] = ()


MIX: tuple[PodShape, ...] = (
    PodShape("shared 10Gi", 1, 0.10, ((ann.GPU_MEMORY, "10Gi"),)),
    PodShape("shared 20Gi", 1, 0.12, ((ann.GPU_MEMORY, "20Gi"),)),
    PodShape("shared 40Gi", 1, 0.06, ((ann.GPU_MEMORY, "40Gi"),)),
    PodShape("1 GPU", 1, 0.26),
    PodShape("1 GPU <=75C", 1, 0.05, ((ann.MAX_TEMPERATURE, "75"),)),
    PodShape("2 GPU", 2, 0.14),
    PodShape("4 GPU nvlink", 4, 0.08, ((ann.TOPOLOGY, "nvlink-required"),)),
    PodShape("4 GPU", 4, 0.06),
    PodShape("8 GPU", 8, 0.08, ((ann.TOPOLOGY, "nvlink-preferred"),)),
)


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod of the stream: its shape and how many pods later it finishes."""

    n: int
    shape: PodShape
    lifetime: int


def pod_stream(pods: int, seed: int, mean_lifetime: float) -> list[PodSpec]:
    """The demo's pods, drawn from ``seed`` alone: kelvin and the baseline get the very same stream."""
    rng = random.Random(seed)
    weights = [s.weight for s in MIX]
    out = []
    for n in range(1, pods + 1):
        shape = rng.choices(MIX, weights=weights)[0]
        out.append(PodSpec(n, shape, max(1, int(rng.expovariate(1.0 / mean_lifetime)))))
    return out


def demo_fleet(
    nodes: int, gpus: int, hot_nodes: int, seed: int, initial_load: float = 0.1, ambient_c: float = 30.0
) -> FleetSpec:
    """``nodes`` nodes of ``gpus`` H100s (NVSwitch), the last ``hot_nodes`` of them poorly cooled (they throttle
    under sustained load), part-full at start with whole GPUs and scattered memory-pool shares."""
    groups: list[dict[str, Any]] = [{"count": nodes - hot_nodes, "gpus": gpus, "topology": "nvswitch"}]
    if hot_nodes:
        groups.append({"count": hot_nodes, "gpus": gpus, "topology": "nvswitch", "poorCoolingFraction": 1.0})
    return FleetSpec.parse(
        {"seed": seed, "initialLoad": initial_load, "ambientC": ambient_c, "groups": groups}, source="demo fleet"
    )


def make_pod(name: str, shape: PodShape, uid: str) -> dict[str, Any]:
    """A Pod as kube-scheduler sends it (API JSON): one container requesting ``nvidia.com/gpu``."""
    return {
        "metadata": {
            "name": name,
            "namespace": "demo",
            "uid": uid,
            "annotations": dict(shape.annotations),
            "labels": {"app": "kelvin-demo", "shape": shape.label.replace(" ", "-").replace("<=", "max")},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {
                        "limits": {ann.GPU_RESOURCE: str(shape.gpus)},
                        "requests": {ann.GPU_RESOURCE: str(shape.gpus), "cpu": "4", "memory": "32Gi"},
                    },
                }
            ],
            "schedulerName": "default-scheduler",
            "priority": 0,
        },
        "status": {"phase": "Pending"},
    }


def demand(shape: PodShape) -> float:
    """GPUs' worth of a pod: whole GPUs, or a memory pool's share of one 80 GiB GPU."""
    pool = dict(shape.annotations).get(ann.GPU_MEMORY)
    if pool is None:
        return float(shape.gpus)
    return min(1.0, int(pool.removesuffix("Gi")) / 80)


#: The comparison run: what a GPU-blind scheduler does (random feasible node and GPUs, no thermal limits); its
#: ``random`` policy is one of the simulator's baselines, built through the simulator's registry.
BASELINE_POLICY: dict[str, Any] = {
    "filters": {"thermalHardLimits": False, "throttleHardLimit": False, "hotNodes": False},
    "scoring": {"random": {"weight": 1, "args": {"seed": 0}}},
    "picker": "random",
    "pickerArgs": {"seed": 0},
}


def baseline_policy(seed: int) -> PolicyConfig:
    """:data:`BASELINE_POLICY` with its random choices seeded from the demo's seed."""
    data: dict[str, Any] = {
        **BASELINE_POLICY,
        "scoring": {"random": {"weight": 1, "args": {"seed": seed}}},
        "pickerArgs": {"seed": seed},
    }
    return PolicyConfig.from_mapping(data, source="baseline policy")
