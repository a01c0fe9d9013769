"""The paper's baselines as kelvin score plugins: the orderings their definitions imply."""

from __future__ import annotations

import numpy as np

from scheduler_plugin.model import FleetArrays, GpuRequest
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.simulator.baselines import SIMULATOR
from scheduler_plugin.simulator.fleet import apply_placement, build_fleet
from scheduler_plugin.simulator.trace import TraceNode

GIB = 2**30
CTX = CycleContext(now=0.0)


def fleet4() -> FleetArrays:
    return build_fleet([TraceNode(f"n{i}", 64_000, 256 * GIB, 4, "T4") for i in range(4)])


def test_best_fit_prefers_the_fullest_node_and_normalises_to_integers() -> None:
    f = fleet4()
    apply_placement(f, GpuRequest(count=2, cpu_milli=8000), 1, (0, 1))
    apply_placement(f, GpuRequest(count=1, cpu_milli=4000), 2, (0,))
    raw = SIMULATOR.build("score", "best-fit", {}, "t").score(GpuRequest(count=1, cpu_milli=1000), f, np.arange(4), CTX)
    assert raw.tolist() == [0.0, 100.0, 50.0, 0.0]


def test_gpu_packing_bands_shared_gpu_then_used_node_then_idle_node() -> None:
    f = fleet4()
    apply_placement(f, GpuRequest(count=1, milli=500), 1, (0,))
    apply_placement(f, GpuRequest(count=1), 2, (0,))
    plugin = SIMULATOR.build("score", "gpu-packing", {}, "t")
    raw = plugin.score(GpuRequest(count=1, milli=300), f, np.arange(4), CTX)
    assert raw[1] > raw[2] > raw[0] == raw[3]


def test_gpu_clustering_keeps_classes_together() -> None:
    f = fleet4()
    plugin = SIMULATOR.build("score", "gpu-clustering", {}, "t")
    share, whole = GpuRequest(count=1, milli=300), GpuRequest(count=1)
    # node 0 gets a share pod, node 1 a whole-GPU pod, node 2 both; node 3 stays empty
    for row, req in ((0, share), (1, whole), (2, share), (2, whole)):
        gpus = plugin.pick(req, f, row, CTX)
        assert gpus is not None
        apply_placement(f, req, row, gpus)
    raw = plugin.score(share, f, np.arange(4), CTX)
    assert raw[0] > raw[2] > raw[3] > raw[1]


def test_gpu_clustering_bands_follow_the_classes_it_remembers() -> None:
    """The bands are read from per-row arrays kept beside the classes per node name (a loop over the candidates
    before): over random placements, and on a second fleet with the same node names in another order, every score
    is the paper's band of the remembered classes plus the fill term."""
    nodes = [TraceNode(f"n{i}", 64_000, 256 * GIB, 8, "T4") for i in range(12)]
    f, other = build_fleet(nodes), build_fleet(nodes[::-1])
    plugin = SIMULATOR.build("score", "gpu-clustering", {}, "t")
    reqs = [GpuRequest(count=1, milli=300), GpuRequest(count=1), GpuRequest(count=2), GpuRequest(count=0)]
    rng = np.random.default_rng(3)

    def expected(req: GpuRequest, fleet: FleetArrays) -> list[float]:
        cls = -1 if req.shared else req.count
        out = []
        for r in range(fleet.n_nodes):
            have = plugin.classes.get(fleet.names[r], set())
            band = (3 if len(have) == 1 else 2) if cls in have else (1 if not have else 0)
            fill = 25 * (8000 - int(fleet.free_milli[r].sum())) // 8000
            out.append(float(band * 25 + fill) if req.wants_gpu else 0.0)
        return out

    for _ in range(60):
        req = reqs[int(rng.integers(len(reqs)))]
        on = f if rng.random() < 0.8 else other
        rows = np.arange(on.n_nodes)
        assert plugin.score(req, on, rows, CTX).tolist() == expected(req, on)
        row = int(rng.integers(on.n_nodes))
        gpus = plugin.pick(req, on, row, CTX)
        if gpus is not None:
            apply_placement(on, req, row, gpus)
    assert len(plugin.classes) > 3


def test_dotproduct_and_random_choose_eligible_gpus() -> None:
    f = fleet4()
    apply_placement(f, GpuRequest(count=1, milli=800), 0, (2,))
    for name, args in (("dotproduct", {}), ("random", {"seed": 3})):
        plugin = SIMULATOR.build("score", name, args, "t")
        raw = plugin.score(GpuRequest(count=1, milli=500), f, np.arange(4), CTX)
        assert raw.shape == (4,) and np.isfinite(raw).all()
        gpus = plugin.pick(GpuRequest(count=1, milli=500), f, 0, CTX)
        assert gpus is not None and 2 not in gpus  # the 800-used GPU has only 200 left
