"""How fast the operator's pure parts are: the hotness state machine, its vectorised entry rule, and one reconcile
cycle over a node (strategies, planner, evictor) with an in-memory API. Prints measured figures; asserts nothing.

    python bench/operator_cycle.py [--nodes 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Mapping
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "operator")]

from harness import load_line  # noqa: E402
from kelvin_operator.k8s import EvictOutcome, EvictResult, ObjectRef  # noqa: E402
from kelvin_operator.reconcile import Reconciler  # noqa: E402
from kelvin_operator.settings import OperatorConfig  # noqa: E402

from scheduler_plugin import hotness  # noqa: E402
from scheduler_plugin.model.times import format_time  # noqa: E402
from scheduler_plugin.simulator.simulated_fleet import SimulatedFleetSource  # noqa: E402


class NullKube:
    async def evict(self, namespace: str, name: str) -> EvictOutcome:
        return EvictOutcome(EvictResult.PDB_BLOCKED, "bench")

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        return None

    async def set_taint(self, node: str, key: str, value: str, effect: str, present: bool) -> bool:
        return True

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    a = ap.parse_args()
    src = SimulatedFleetSource.uniform(a.nodes, seed=1, initialLoad=0.6)
    now = time.time()
    nodes = src.snapshot_nodes(now)
    cfg = hotness.HotnessConfig(hot_celsius=70.0, cool_celsius=60.0)

    t = time.perf_counter()
    states = {n.name: hotness.NodeHotness() for n in nodes}
    for n in nodes:
        states[n.name], _ = hotness.step(states[n.name], hotness.observe(n, cfg), now, cfg)
    dt = time.perf_counter() - t
    print(
        f"hotness observe+step: {len(nodes)} nodes x {len(nodes[0].gpus)} GPUs in {dt * 1e3:.1f} ms "
        f"({dt / len(nodes) * 1e6:.1f} µs/node); {sum(s.hot for s in states.values())} hot"
    )

    from scheduler_plugin.model.snapshot import build_arrays

    arrays = build_arrays(nodes)
    t = time.perf_counter()
    reps = 20
    for _ in range(reps):
        mask = hotness.trigger_mask(arrays, cfg)
    dt = (time.perf_counter() - t) / reps
    print(
        f"trigger_mask (vectorised): {len(nodes)} nodes in {dt * 1e3:.2f} ms; {int(mask.any(axis=1).sum())} triggering"
    )

    rec = Reconciler(OperatorConfig(protection={"min_pod_age_s": 0}, limits={"max_per_node_per_cycle": 2}), NullKube())
    placements = src.placements()
    pods_by_node: dict[str, list[dict[str, object]]] = {}
    for key, (node_name, asg) in placements.items():
        ns, name = key.split("/", 1)
        pods_by_node.setdefault(node_name, []).append(
            {
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "uid": key,
                    "annotations": {"kelvin.dev/gpu-assigned": ",".join(map(str, asg.gpu_indices))},
                    "ownerReferences": [{"kind": "ReplicaSet"}],
                    "creationTimestamp": format_time(now - 3600),
                },
                "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Running"},
            }
        )

    async def cycle() -> float:
        t0 = time.perf_counter()
        for n in nodes:
            await rec.reconcile_node({"metadata": {"name": n.name}, "spec": {}}, n, pods_by_node.get(n.name, []), now)
        return time.perf_counter() - t0

    dt = asyncio.run(cycle())
    print(
        f"reconcile_node (in-memory API): {len(nodes)} nodes, {len(placements)} pods in {dt:.2f} s "
        f"({dt / len(nodes) * 1e3:.2f} ms/node); hot nodes {sum(s.hot for s in rec.states.values())}"
    )
    print(load_line())


if __name__ == "__main__":
    main()
