"""Latency of the extender's preempt verb at 5,000 nodes (in process: parse, victim choice, reply).

The fleet: 5,000 nodes x 8 H100, half NVSwitch, half two 4-GPU NVLink islands, every GPU taken by low-priority pods
kelvin bound (their records carry UIDs, priorities, start and checkpoint times): ``whole`` fills each GPU with one
1-GPU pod (8 units a node: the exact search), ``pools`` with three memory-pool pods (24 units: the bounded search).
kube-scheduler sends ``NodeNameToMetaVictims`` (nodeCacheCapable: true) for its candidate nodes, up to
max(100, 10 % of the nodes) = 500 at 5,000; the preemptor asks 4 GPUs nvlink-required (``whole``) or one 40 GiB pool
(``pools``). The verb judges nodes in kube-scheduler's order and keeps at most 16 (``MAX_KEPT_NODES``), then
answers the cheapest of them ("answered"). Prints p50 / p99 per request and per node judged and kept, and the
machine's load. ``--budgets N``: N PodDisruptionBudgets in the pods' namespace, listed as the extender lists them
(:mod:`scheduler_plugin.extender.pdb_lister`), one a label value, the pods' labels spread over them.

    python bench/extender_preempt.py                      # 5,000 nodes; 1, 100 and 500 candidates; 30 requests each
    python bench/extender_preempt.py --requests 10 --candidates 500
    python bench/extender_preempt.py --requests 10 --candidates 500 --budgets 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from harness import load_line

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from scheduler_plugin.extender.app import build_extender  # noqa: E402
from scheduler_plugin.extender.pdb_lister import PdbLister  # noqa: E402
from scheduler_plugin.extender.preempt import PreemptVerb  # noqa: E402
from scheduler_plugin.extender.preempt_wire import parse_preemption  # noqa: E402
from scheduler_plugin.extender.wire import dumps  # noqa: E402
from scheduler_plugin.model import GIB, GpuAssignment, GpuInfo, GpuNode  # noqa: E402
from scheduler_plugin.model.eviction import EvictionFacts  # noqa: E402
from scheduler_plugin.settings import Settings  # noqa: E402

NOW = 1_800_000_000.0


def fleet(n: int, kind: str, budgets: int = 0) -> list[GpuNode]:
    out = []
    for i in range(n):
        islands = i % 2 == 1

        def group(j: int, islands: bool = islands) -> range:
            return range(j // 4 * 4, j // 4 * 4 + 4) if islands else range(8)

        gpus = tuple(
            GpuInfo(
                index=j, uuid=f"n{i}-{j}", model="H100-SXM-80GB", memory_total_bytes=80 * GIB,
                memory_used_bytes=70 * GIB, numa_node=j // 4, pcie_switch=f"sw{j // 2}",
                nvlink_peers=frozenset(k for k in group(j) if k != j),
            )
            for j in range(8)
        )  # fmt: skip
        a = []
        for j in range(8):
            for s in range(1 if kind == "whole" else 3):
                a.append(
                    GpuAssignment(
                        pod_key=f"low/n{i}-{j}-{s}", gpu_indices=(j,), pod_uid=f"uid-{i}-{j}-{s}", priority=10 + s,
                        milli=1000 if kind == "whole" else None, memory_bytes=None if kind == "whole" else 26 * GIB,
                        eviction=EvictionFacts(started_at=NOW - 600 - 37 * j - s, checkpoint_at=NOW - 60 * (j % 3),
                                               labels=(("app", f"a{(i * 8 + j) % budgets}"),) if budgets else ()),
                    )
                )  # fmt: skip
        out.append(GpuNode(name=f"node-{i}", gpus=gpus, cpu_allocatable_milli=128_000,
                           memory_allocatable_bytes=1024 * GIB, assignments=tuple(a), observed_at=NOW))  # fmt: skip
    return out


class Budgets:
    """The API server's answer to the list of PodDisruptionBudgets: ``n`` budgets allowing one disruption each."""

    def __init__(self, n: int) -> None:
        self.items = [
            {"metadata": {"name": f"b{k}", "namespace": "low"},
             "spec": {"selector": {"matchLabels": {"app": f"a{k}"}}}, "status": {"disruptionsAllowed": 1}}
            for k in range(n)
        ]  # fmt: skip

    async def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        return {"items": self.items, "metadata": {}}


class Static:
    name = "static"

    def __init__(self, nodes: Sequence[GpuNode]) -> None:
        self.nodes = nodes

    async def fetch(self) -> Sequence[GpuNode]:
        return self.nodes

    async def close(self) -> None:
        return None


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000, q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--candidates", type=int, nargs="+", default=[1, 100, 500])
    ap.add_argument("--requests", type=int, default=30, help="measured requests per size")
    ap.add_argument("--kinds", nargs="+", choices=["whole", "pools"], default=["whole", "pools"])
    ap.add_argument("--budgets", type=int, default=0, help="PodDisruptionBudgets listed (default 0: none)")
    a = ap.parse_args()
    if max(a.candidates) > a.nodes or a.requests < 1 or a.budgets < 0:
        ap.error("--candidates must not exceed --nodes; --requests must be positive; --budgets not negative")
    print(f"{a.nodes} nodes x 8 GPUs (half NVSwitch, half two NVLink islands), {a.budgets} PDBs; {load_line()}")
    print(f"{'kind':>6} {'nodes':>6} {'answered':>8} {'p50 ms':>8} {'p99 ms':>8} {'exact':>6}")
    for kind in a.kinds:
        src = Static(fleet(a.nodes, kind, a.budgets))
        ext = build_extender(Settings(refresh_interval_s=3600), source=src, clock=lambda: NOW)
        asyncio.run(ext.cache.refresh_once())
        if a.budgets:
            ext.pdbs = PdbLister(Budgets(a.budgets))  # type: ignore[arg-type]
            assert asyncio.run(ext.pdbs.refresh())
        verb = PreemptVerb(ext)
        ann = {"kelvin.dev/topology": "nvlink-required"} if kind == "whole" else {"kelvin.dev/gpu-memory": "40Gi"}
        gpus = "4" if kind == "whole" else "1"
        container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
        pod = {
            "metadata": {"name": "hi", "namespace": "hp", "uid": "uid-hi", "annotations": ann},
            "spec": {"priority": 1000, "containers": [container]},
        }
        for size in a.candidates:
            proposal = {
                f"node-{i}": {"Pods": [{"UID": f"uid-{i}-{j}-0"} for j in range(4)], "NumPDBViolations": 0}
                for i in range(size)
            }
            body = json.dumps({"Pod": pod, "NodeNameToMetaVictims": proposal}).encode()
            times: list[float] = []
            kept = 0
            for _ in range(a.requests + 2):
                t0 = time.perf_counter()
                out = verb(parse_preemption(body))
                dumps(out)
                times.append(time.perf_counter() - t0)
                kept = len(out["NodeNameToMetaVictims"])
            times = times[2:]
            print(f"{kind:>6} {size:>6} {kept:>8} {pct(times, 50):>8.1f} {pct(times, 99):>8.1f} "
                  f"{'yes' if kind == 'whole' else 'no':>6}")  # fmt: skip
    print(f"after: {load_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
