"""``kelvin_extender_rejections_total{reason=...}`` counts each rejected node by its rejection's kind (the class of
the reason, never its text), with the values docs/metrics.md lists."""

from __future__ import annotations

import pytest
from ext_helpers import args, gpu_node, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.model.annotations import GPU_MEMORY, GPU_MODELS, MAX_TEMPERATURE


@pytest.mark.parametrize(
    ("node", "gpus", "annotations", "label", "words"),
    [
        ("part-busy", 9, {}, "gpu_count", "needs 9 GPUs; node has 8 in total"),
        ("part-busy", 4, {}, "gpu_count", "2 of 8 usable GPUs are free; the pod needs 4 whole GPUs"),
        ("part-busy", 1, {GPU_MODELS: "A100"}, "gpu_model", "needs 1 GPU of model A100; node has 8 H100-SXM-80GB"),
        ("part-busy", 1, {GPU_MEMORY: "100Gi"}, "gpu_memory", "the pod needs 100 GiB on one GPU; the largest"),
        ("all-busy", 1, {GPU_MEMORY: "20Gi"}, "gpu_memory", "gpu 0 has 0.0 GiB free; the pod needs 20 GiB on one"),
        ("all-busy", 1, {MAX_TEMPERATURE: "60"}, "thermal", "gpu 0 is at 65 °C, above the pod's kelvin.dev/max-"),
    ],
)
def test_rejections_are_counted_by_kind(
    node: str, gpus: int, annotations: dict[str, str], label: str, words: str
) -> None:
    nodes = [gpu_node("part-busy", busy=range(6)), gpu_node("all-busy", busy=range(8))]
    ext, _, _ = make_extender(nodes)
    with TestClient(create_app(ext)) as c:
        body = c.post("/filter", content=args(pod(gpus=gpus, annotations=annotations), [node])).json()
        failed = {**body["FailedNodes"], **body["FailedAndUnresolvableNodes"]}
        assert failed[node].startswith(words), failed
        m = c.get("/metrics").text
        assert f'kelvin_extender_rejections_total{{reason="{label}"}} 1.0' in m
        others = [ln for ln in m.splitlines() if ln.startswith("kelvin_extender_rejections_total{") and label not in ln]
        assert others and all(ln.endswith(" 0.0") for ln in others), others
