"""examples/checkpoint_training_loop.py completes the handshake with the operator over HTTP (kmock)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import kmock as km
from kelvin_operator.k8s import OperatorKube
from kelvin_operator.reconcile import Reconciler
from kelvin_operator.settings import OperatorConfig
from opkit import gpu, node, node_obj, pod, proc
from opkube import NODES, PODS, evictions_succeed

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.times import parse_time

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "checkpoint_training_loop.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checkpoint_training_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def downward_file(path: Path, annotations: dict[str, str]) -> None:
    path.write_text("\n".join(f"{k}={json.dumps(v)}" for k, v in annotations.items()) + "\n")


async def test_training_loop_answers_and_gets_evicted(
    kmock: km.KubernetesEmulator, kube: OperatorKube, tmp_path: Path
) -> None:
    import time

    ex = load_example()
    evictions_succeed(kmock)
    now = time.time()
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "train"] = pod("train", gpu_indices="0", annotations={ann.CHECKPOINT: "true"}, now=now)
    rec = Reconciler(OperatorConfig(thermal_eviction={"rule": "warm"}), kube)  # every warm pod moves
    hot = node("n1", gpu(0, 90.0, procs=(proc("train", 10),)), now=now)

    async def cycle(t: float) -> list[str]:
        body = await kube.client.get("/api/v1/nodes/n1")
        pods = (await kube.client.get("/api/v1/pods"))["items"]
        return [o.result for o in (await rec.reconcile_node(body, hot, pods, t)).outcomes]

    assert await cycle(now) == ["checkpoint_requested"]
    stored = dict(kmock.objects[PODS, "ml", "train"]["metadata"]["annotations"])
    podinfo = tmp_path / "annotations"
    downward_file(podinfo, stored)  # what the kubelet projects into the pod
    ckpt = tmp_path / "state.json"
    state = await asyncio.to_thread(
        ex.run,
        steps=10_000,
        checkpoint=ckpt,
        annotations_file=podinfo,
        api=str(kmock.url).rstrip("/"),
        namespace="ml",
        name="train",
        every=10_000,
        stop_after_answer=True,
    )
    assert json.loads(ckpt.read_text())["step"] == state["step"] >= 1
    done = kmock.objects[PODS, "ml", "train"]["metadata"]["annotations"][ann.CHECKPOINT_DONE]
    requested = parse_time(stored[ann.CHECKPOINT_REQUESTED])
    assert requested is not None and (parse_time(done) or 0) > requested
    assert await cycle(time.time()) == ["evicted"]
    # the replacement resumes from the checkpoint
    resumed = ex.load(ckpt)
    assert resumed["step"] == state["step"]


def test_downward_api_parsing(tmp_path: Path) -> None:
    ex = load_example()
    f = tmp_path / "a"
    downward_file(f, {ann.CHECKPOINT_REQUESTED: "2026-01-01T00:00:00Z", "other": 'x="y"'})
    parsed = ex.read_annotations(f)
    assert parsed["other"] == 'x="y"'
    assert ex.pending_request(parsed) is not None
    parsed[ann.CHECKPOINT_DONE] = "2026-01-01T00:00:05Z"
    assert ex.pending_request(parsed) is None
    assert ex.read_annotations(tmp_path / "missing") == {}
