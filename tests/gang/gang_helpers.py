"""Helpers of the gang tests: racks of DGX-like nodes, gangs of whole-GPU members, a planner (default policy)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from scheduler_plugin.gang import GangPolicy, TopologyAsk, build_domains
from scheduler_plugin.gang.planner import Gang, GangPlan, GangPlanner, Member, PlanFailure
from scheduler_plugin.model import GpuNode, build_arrays
from scheduler_plugin.policies.framework import Framework
from scheduler_plugin.policies.policy_file import PolicyConfig
from tests.fleet_helpers import NOW, dgx, request, whole

POLICY = GangPolicy.model_validate(
    {"levels": [{"name": "clique", "label": "nvidia.com/gpu.clique"}, {"name": "rack", "label": "kelvin.dev/rack"}]}
)


def labelled(nd: GpuNode, **labels: str) -> GpuNode:
    keys = {"rack": "kelvin.dev/rack", "clique": "nvidia.com/gpu.clique"}
    return replace(nd, labels={keys[k]: v for k, v in labels.items()})


def rack(name: str, n: int, *, busy: Sequence[int] = (), clique_size: int | None = None, **kw: object) -> list[GpuNode]:
    out = []
    for i in range(n):
        a = [whole(f"other-{name}-{i}", *range(8))] if i in busy else []
        nd = dgx(f"{name}-n{i}", 8, assignments=a, **kw)
        clique = f"{name}-c{i // clique_size}" if clique_size else f"{name}-n{i}"
        out.append(labelled(nd, rack=name, clique=clique))
    return out


def gang(n: int, gpus: int = 8, topology: TopologyAsk | None = None, key: str = "ml/kelvin:g") -> Gang:
    name = key.rpartition(":")[2]
    members = tuple(Member(f"ml/{name}-{i}", request(gpus, pod=f"{name}-{i}"), index=i) for i in range(n))
    return Gang(key, members, topology)


def planner(fw: Framework | None = None) -> GangPlanner:
    return GangPlanner(fw or Framework.from_config(PolicyConfig()), POLICY)


def plan(nodes: Sequence[GpuNode], g: Gang, p: GangPlanner | None = None) -> GangPlan | PlanFailure:
    p = p or planner()
    fleet = build_arrays(nodes)
    labels: list[Mapping[str, str]] = [nd.labels for nd in nodes]
    domains = build_domains(fleet.names, labels, POLICY)
    return p.plan(g, fleet, domains, p.fw.context(fleet, NOW))
