"""Gang admission: bad gang annotations are refused naming the annotation and the fix; gang members get the
kelvin.dev/gang scheduling gate when webhook.gangGates is on (pure, and over HTTPS through the real kopf handlers)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import kmock as km
from kelvin_operator.gangs import gated, refusal
from kelvin_operator.settings import OperatorConfig
from opkit import gpu, node, node_obj, pod
from opkube import EVENTS, NODES, PODS
from test_operator_kopf import cert, free_port, review, running, wait_for, webhook_up

from scheduler_plugin.gang import GangPolicy
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.snapshot import Snapshot

__all__ = ["cert"]  # the HTTPS test's certificate fixture, shared with test_operator_kopf

POLICY = GangPolicy.model_validate({"levels": [{"name": "rack", "label": "kelvin.dev/rack"}]})


def member(**annotations: str) -> dict[str, Any]:
    return pod("w-0", annotations={ann.GANG: "llama", ann.GANG_SIZE: "4", **annotations}, gpus=8)


def test_a_good_gang_is_admitted_and_gated() -> None:
    p = member()
    assert refusal(p, POLICY, None) is None
    assert gated(p, POLICY) == [{"name": ann.GANG_SCHEDULING_GATE}]
    # a pod already gated by someone else keeps that gate; ours is added once
    p["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert gated(p, POLICY) == [{"name": "kueue.x-k8s.io/admission"}, {"name": ann.GANG_SCHEDULING_GATE}]
    p["spec"]["schedulingGates"].append({"name": ann.GANG_SCHEDULING_GATE})
    assert gated(p, POLICY) is None


def test_a_pod_of_no_gang_is_left_alone() -> None:
    p = pod("plain", gpus=1)
    assert refusal(p, POLICY, None) is None and gated(p, POLICY) is None


def test_bad_gang_input_is_refused_naming_the_annotation_and_the_fix() -> None:
    msg = refusal(member(**{ann.GANG_SIZE: "four"}), POLICY, None)
    assert msg is not None and "kelvin.dev/gang-size='four'" in msg and "integer from 1" in msg
    msg = refusal(member(**{ann.GANG_TOPOLOGY: "required=row"}), POLICY, None)
    assert msg is not None and "level 'row' is not defined" in msg and "node, rack, cluster" in msg
    assert gated(member(**{ann.GANG_SIZE: "four"}), POLICY) is None  # left to the validating webhook


def test_required_at_a_level_no_node_carries_is_refused() -> None:
    unlabelled = Snapshot(nodes=(node("n1", gpu(0)),), taken_at=0.0)
    msg = refusal(member(**{ann.GANG_TOPOLOGY: "required=rack"}), POLICY, unlabelled)
    assert msg is not None and "no node carries the label kelvin.dev/rack" in msg and "preferred=rack" in msg
    labelled = Snapshot(nodes=(replace(node("n1", gpu(0)), labels={"kelvin.dev/rack": "r1"}),), taken_at=0.0)
    assert refusal(member(**{ann.GANG_TOPOLOGY: "required=rack"}), POLICY, labelled) is None


def test_required_level_carried_only_by_the_node_objects_is_admitted() -> None:
    """A Prometheus snapshot has no Kubernetes labels: the Node objects' labels (the operator's index) count."""
    unlabelled = Snapshot(nodes=(node("n1", gpu(0)),), taken_at=0.0)
    ask = member(**{ann.GANG_TOPOLOGY: "required=rack"})
    assert refusal(ask, POLICY, unlabelled, {"n1": {"kelvin.dev/rack": "r1"}}) is None
    msg = refusal(ask, POLICY, unlabelled, {"n1": {"other": "x"}})
    assert msg is not None and "no node carries the label kelvin.dev/rack" in msg


async def test_the_webhooks_refuse_bad_gangs_and_gate_members(
    kmock: km.KubernetesEmulator, cert: tuple[Path, Path]
) -> None:
    port = free_port()
    cfg = OperatorConfig(
        standalone=True,
        metrics_port=0,
        interval_s=3600,
        gang=POLICY,
        webhook={
            "addr": "127.0.0.1",
            "port": port,
            "host": "localhost",
            "certfile": cert[0],
            "pkeyfile": cert[1],
            "gang_gates": True,
        },
    )
    ctx = ssl.create_default_context(cafile=str(cert[0]))
    async with running(kmock, cfg, [node("n1", gpu(0, total_gib=80))]), httpx.AsyncClient(verify=ctx) as http:
        url = f"https://localhost:{port}"
        await webhook_up(http, url)
        bad = member(**{ann.GANG_SIZE: "0"})
        r = (await http.post(f"{url}/gpu-memory", json=review(bad, "v1"))).json()
        assert r["response"]["allowed"] is False and r["response"]["status"]["code"] == 400
        assert "kelvin.dev/gang-size='0'" in r["response"]["status"]["message"]
        good = member()
        r = (await http.post(f"{url}/gpu-memory", json=review(good, "v2"))).json()
        assert r["response"]["allowed"] is True
        r = (await http.post(f"{url}/gpu-env", json=review(good, "m1"))).json()
        patched = jsonpatch.apply_patch(good, json.loads(base64.b64decode(r["response"]["patch"])))
        assert patched["spec"]["schedulingGates"] == [{"name": ann.GANG_SCHEDULING_GATE}]


async def test_a_gated_gang_is_planned_once_whichever_node_timers_run(kmock: km.KubernetesEmulator) -> None:
    """kopf gives every object's handlers its own copy of the memo: the planner loop must be one per operator, or
    each node's timer plans (and patches, and announces) the same gang again."""
    cfg = OperatorConfig(standalone=True, metrics_port=0, interval_s=0.2, gang=POLICY, dry_run=False)
    names = ("n1", "n2", "n3")
    for name in names:
        kmock.objects[NODES, None, name] = node_obj(name)
    for i in range(2):
        p = pod(f"w-{i}", annotations={ann.GANG: "llama", ann.GANG_SIZE: "2", ann.GANG_INDEX: str(i)}, gpus=8)
        del p["spec"]["nodeName"]
        p["spec"]["schedulingGates"] = [{"name": ann.GANG_SCHEDULING_GATE}]
        p["status"] = {"phase": "Pending"}
        kmock.objects[PODS, "ml", f"w-{i}"] = p
    fleet = [node(n, *(gpu(g, total_gib=80) for g in range(8))) for n in names]

    def planned() -> bool:
        return all(
            ann.GANG_PLANNED_NODE in kmock.objects[PODS, "ml", f"w-{i}"]["metadata"]["annotations"] for i in range(2)
        )

    async with running(kmock, cfg, fleet):
        await wait_for(planned)
        await asyncio.sleep(1.0)  # every node's timer has run a few more times (the next pass is due after 5 s)
    announced = [o for k, o in kmock.objects.items() if k[0] == EVENTS and o.get("reason") == "GangPlanned"]
    assert len(announced) == 1, [o.get("message") for o in announced]
