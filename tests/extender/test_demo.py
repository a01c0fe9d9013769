"""``kelvin demo``: repeatable for a seed, and the scenario shows what kelvin does that a GPU-blind scheduler cannot
(fragmentation, hot nodes)."""

from __future__ import annotations

import io
import logging

import httpx
import pytest
from rich.console import Console

from scheduler_plugin.demo import run_demo
from scheduler_plugin.demo.driver import Demo
from scheduler_plugin.demo.scenario import PodShape, make_pod, pod_stream
from scheduler_plugin.demo.summary import Refusals
from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.server import ServerThread
from scheduler_plugin.model import GIB
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.policies.reasons import GpuMemoryFull, GpusTooSmall, NoNvlinkGroup, TooFewGpus


@pytest.mark.slow
def test_same_seed_same_numbers() -> None:
    runs = [Demo(pods=60, nodes=6, seed=5, interval_s=0.0).run(live=False, progress=False) for _ in range(2)]
    assert runs[0].headline() == runs[1].headline()
    assert [(r.node, r.gpus, r.note) for r in runs[0].rows] == [(r.node, r.gpus, r.note) for r in runs[1].rows]
    assert pod_stream(60, 5, 15.0) == pod_stream(60, 5, 15.0) != pod_stream(60, 6, 15.0)


@pytest.mark.slow
def test_kelvin_beats_the_gpu_blind_baseline() -> None:
    out = io.StringIO()
    kelvin, baseline = run_demo(seed=0, live=False, console=Console(file=out, width=10_000, soft_wrap=True))
    assert baseline is not None
    k, b = kelvin.headline(), baseline.headline()
    assert k["placed"] > b["placed"] and k["placed_gpus"] > b["placed_gpus"], (k, b)
    assert k["refused"] < b["refused"] and k["refused_fragmented"] < b["refused_fragmented"], (k, b)
    assert k["hot_placements"] == 0 < b["hot_placements"], (k, b)
    assert k["throttled_gpu_minutes"] <= b["throttled_gpu_minutes"], (k, b)
    text = out.getvalue()
    assert "N of N" not in text and "kelvin demo summary" in text
    assert "(e.g. gpu-node-" in text  # a refusal is shown with a real node and its real numbers


def test_the_demo_leaves_the_log_level_as_it_found_it() -> None:
    """The demo quiets kelvin's loggers while it runs; afterwards they log as before (a later test or caller in the
    same process would otherwise lose every warning)."""
    logger = logging.getLogger("scheduler_plugin")
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        run_demo(pods=10, nodes=2, seed=1, live=False, compare=False, console=Console(file=io.StringIO()))
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(before)


def test_refusals_are_grouped_by_the_typed_need_and_shown_with_the_nearest_node() -> None:
    """The summary reads the rejections' fields, not their text: the example is the node with the most room (in GiB,
    free or in all; not the node whose first printed number is largest, here a GPU index), and pods needing 8 or 4
    GPUs of 2-GPU nodes are two needs, not one group per node size."""
    refusals = Refusals()
    note = refusals.record(
        {
            "n-a": GpuMemoryFull(gpu=7, free_gib=2.0, memory_bytes=20 * GIB),
            "n-b": GpuMemoryFull(gpu=1, free_gib=15.0, memory_bytes=20 * GIB),
            "n-c": GpusTooSmall(memory_bytes=20 * GIB, largest_bytes=12 * GIB),
            "n-d": NoNvlinkGroup(count=4, usable=8),
        }
    )
    assert note == "n-b: gpu 1 has 15.0 GiB free; the pod needs 20 GiB on one GPU"
    refusals.record({"n-a": TooFewGpus(count=8, total=2), "n-b": TooFewGpus(count=8, total=2)})
    refusals.record({"n-a": TooFewGpus(count=4, total=2)})
    assert refusals.reasons == {"the pod needs 20 GiB on one GPU": 1, "needs 8 GPUs": 1, "needs 4 GPUs": 1}
    assert refusals.examples["needs 8 GPUs"] == "n-a: needs 8 GPUs; node has 2 in total"
    assert refusals.record({}) == "no nodes" and refusals.reasons["no nodes"] == 1


def test_the_typed_rejections_are_the_words_kube_scheduler_got() -> None:
    """The driver's typed rejections come from the snapshot and clock the ``/filter`` answer came from: the same
    words, node by node."""
    demo = Demo(pods=1, nodes=3, gpus=4, hot_nodes=1, seed=0, interval_s=0.0)
    demo._refresh()
    try:
        with ServerThread(create_app(demo.ext)) as url, httpx.Client(base_url=url, timeout=30.0) as client:
            for shape in (PodShape("8 GPU", 8, 1.0), PodShape("4 GPU", 4, 1.0, ((ann.GPU_MODELS, "A100"),))):
                pod = make_pod("p", shape, uid="00000000-0000-4000-8000-000000000001")
                res = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": demo.names}).json()
                failed = {**res["FailedNodes"], **res["FailedAndUnresolvableNodes"]}
                assert res["NodeNames"] == [] and len(failed) == 3
                typed = demo.rejections(pod, list(failed))
                assert {n: r.reason for n, r in typed.items()} == failed
    finally:
        demo._loop.close()
