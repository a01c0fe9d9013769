"""/bind is idempotent per pod UID (issue 14 item 18): repeating it never charges the pod's GPUs twice."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from ext_helpers import args, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.binder import BindError
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.model import GpuAssignment
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, SimulatedFleetSource


def binding(name: str, node: str = "gpu-node-2", uid: str = "") -> bytes:
    body = {"PodName": name, "PodNamespace": "default", "PodUID": uid or f"uid-{name}", "Node": node}
    return json.dumps(body).encode()


def charged(ext: Extender, node: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(a.pod_key, a.gpu_indices) for a in ext.ledger.entries(ext.clock()).get(node, [])]


class ScriptedBinder:
    """Records every Binding; each call takes the next of ``outcomes`` (None: success; a BindError: raised), and
    waits for ``release`` when it is given (an API server that is slow to answer)."""

    def __init__(self, *outcomes: BindError | None, release: asyncio.Event | None = None) -> None:
        self.outcomes = list(outcomes)
        self.release = release
        self.calls: list[tuple[str, str, tuple[int, ...]]] = []

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: tuple[int, ...]) -> None:
        self.calls.append((name, node, gpus))
        if self.release is not None:
            await self.release.wait()
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome

    async def close(self) -> None:
        return None


@pytest.fixture
async def started() -> AsyncIterator[Any]:
    """Start the snapshot cache of the extenders a test makes; stop them at the end."""
    exts: list[Extender] = []

    async def start(ext: Extender) -> Extender:
        await ext.cache.start()
        exts.append(ext)
        return ext

    yield start
    for e in exts:
        await e.cache.stop()


def test_repeating_a_bind_on_the_simulated_fleet_charges_one_gpu() -> None:
    """The issue's reproduction: the same bind three times gave ``gpus 1``, ``gpus 2``, ``gpus 3``."""
    src = SimulatedFleetSource(FleetSpec.uniform(2, 8, seed=0, initial_load=0.0))
    ext, _, _ = make_extender(source=src, clock=time.time)
    with TestClient(create_app(ext)) as c:
        c.post("/filter", content=args(pod("once", gpus=1)))
        assert c.post("/bind", content=binding("once", "gpu-node-1")).json() == {"Error": ""}
        first = src.placements()["default/once"]
        for _ in range(2):
            assert c.post("/bind", content=binding("once", "gpu-node-1")).json() == {"Error": ""}
            assert src.placements()["default/once"] == first  # the same GPU, not the next free one
        assert charged(ext, "gpu-node-1") == [("default/once", first[1].gpu_indices)]
        # the node still has 7 free GPUs for a 7-GPU pod
        assert "gpu-node-1" in c.post("/filter", content=args(pod("seven", gpus=7))).json()["NodeNames"]
        m = c.get("/metrics").text
        assert 'kelvin_extender_decisions_total{result="bound",verb="bind"} 3.0' in m


async def test_a_repeated_bind_makes_no_second_api_call(started: Any) -> None:
    binder = ScriptedBinder()
    ext = await started(make_extender(binder=binder)[0])
    ext.filter(args(pod("p", gpus=2)))
    for _ in range(3):
        assert await ext.bind(binding("p")) == {"Error": ""}
    assert len(binder.calls) == 1 and len(binder.calls[0][2]) == 2
    assert charged(ext, "gpu-node-2") == [("default/p", binder.calls[0][2])]


async def test_a_repeat_to_another_node_is_refused_naming_the_node(started: Any) -> None:
    binder = ScriptedBinder()
    ext = await started(make_extender(binder=binder)[0])
    ext.filter(args(pod("p")))
    assert await ext.bind(binding("p", "gpu-node-2")) == {"Error": ""}
    again = await ext.bind(binding("p", "gpu-node-1"))
    assert "already bound to gpu-node-2, not gpu-node-1" in again["Error"]
    assert len(binder.calls) == 1 and charged(ext, "gpu-node-1") == []


async def test_a_repeat_while_the_first_is_at_the_api_server_waits_for_it(started: Any) -> None:
    release = asyncio.Event()
    binder = ScriptedBinder(release=release)
    ext = await started(make_extender(binder=binder)[0])
    ext.filter(args(pod("p")))
    first = asyncio.create_task(ext.bind(binding("p")))
    second = asyncio.create_task(ext.bind(binding("p")))
    for _ in range(1000):  # a bounded number of turns of the event loop, no timing
        if binder.calls:
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(binder.calls) == 1
    assert not second.done()  # waiting for the first's outcome, not binding again
    release.set()
    assert await first == {"Error": ""} and await second == {"Error": ""}
    assert len(binder.calls) == 1 and len(charged(ext, "gpu-node-2")) == 1


async def test_a_retry_after_an_unknown_outcome_sends_the_same_gpus(started: Any) -> None:
    binder = ScriptedBinder(BindError("504 gateway timeout", 504), None)
    ext = await started(make_extender(binder=binder)[0])
    ext.filter(args(pod("p")))
    assert "504" in (await ext.bind(binding("p")))["Error"]
    assert await ext.bind(binding("p")) == {"Error": ""}
    assert [c[2] for c in binder.calls] == [binder.calls[0][2]] * 2
    assert len(charged(ext, "gpu-node-2")) == 1


async def test_a_retry_after_a_refusal_is_a_fresh_bind(started: Any) -> None:
    binder = ScriptedBinder(BindError("422 invalid", 422), None)
    ext = await started(make_extender(binder=binder)[0])
    ext.filter(args(pod("p")))
    assert "422" in (await ext.bind(binding("p")))["Error"]
    assert charged(ext, "gpu-node-2") == []  # released at once
    assert await ext.bind(binding("p")) == {"Error": ""}
    assert len(binder.calls) == 2 and len(charged(ext, "gpu-node-2")) == 1


async def test_a_pod_telemetry_already_shows_on_the_node_is_not_bound_again(started: Any) -> None:
    binder = ScriptedBinder()
    ext, src, _ = make_extender(binder=binder)
    listed = GpuAssignment(pod_key="default/p", gpu_indices=(3,), pod_uid="uid-p")  # from the pods' annotations
    src.nodes[1] = replace(src.nodes[1], assignments=(listed,))
    await started(ext)
    ext.filter(args(pod("p")))
    assert await ext.bind(binding("p")) == {"Error": ""}
    assert binder.calls == [] and charged(ext, "gpu-node-2") == []


async def test_pods_of_the_same_name_with_other_uids_bind_on_their_own(started: Any) -> None:
    binder = ScriptedBinder()
    ext = await started(make_extender(binder=binder)[0])
    ext.filter(args(pod("p", uid="uid-a")))
    assert await ext.bind(binding("p", uid="uid-a")) == {"Error": ""}
    ext.filter(args(pod("p", uid="uid-b")))
    assert await ext.bind(binding("p", uid="uid-b")) == {"Error": ""}
    assert len(binder.calls) == 2
