"""``kelvin demo``: repeatable for a seed, and the scenario shows what kelvin does that a GPU-blind scheduler cannot
(fragmentation, hot nodes)."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from scheduler_plugin.demo import Demo, pod_stream, run_demo


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
