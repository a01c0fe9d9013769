"""One strategy's unexpected failure on a node must not stop the others: the thermal eviction still happens."""

from __future__ import annotations

import logging

import pytest
from kelvin_operator import reconcile
from kelvin_operator.k8s import EvictOutcome, EvictResult, ObjectRef
from kelvin_operator.reconcile import Reconciler
from kelvin_operator.settings import OperatorConfig
from opkit import T0, gpu, node, node_obj, pod, proc


class RecordingKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    async def evict(self, namespace: str, name: str) -> EvictOutcome:
        self.calls.append(("evict", namespace, name))
        return EvictOutcome(EvictResult.EVICTED)

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self.calls.append(("annotate", namespace, name))

    async def set_taint(self, *args: object, **kwargs: object) -> bool:
        self.calls.append(("taint",))
        return True

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None:
        self.calls.append(("event", reason))


async def test_a_failing_pool_strategy_does_not_block_thermal_evictions(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(reconcile, "memory_pools", broken)
    kube = RecordingKube()
    r = Reconciler(OperatorConfig(standalone=True, thermal_eviction={"rule": "warm"}), kube)  # type: ignore[arg-type]
    hot = node("n1", gpu(0, 90.0, procs=(proc("hot-job", 10.0),)))
    with caplog.at_level(logging.ERROR, logger="kelvin.operator"):
        res = await r.reconcile_node(node_obj("n1"), hot, [pod("hot-job")], T0)
    assert ("taint",) in kube.calls
    assert any(c[0] in ("evict", "annotate") for c in kube.calls), kube.calls  # the thermal strategy still acted
    assert res.candidates and res.violations == []
    assert any("node n1: the memory-pool strategy failed" in r.getMessage() for r in caplog.records)
