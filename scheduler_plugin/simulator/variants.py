"""Workload variant families built from a trace (the FGD paper's, Weng et al., USENIX ATC '23, section 6), to check
that a policy is not tuned to one file.

Each variant is a pure, seeded transformation of the pod list (the nodes stay); each family has a parameter, the
level, and the paper's levels by default:

* ``multi-gpu`` (0.2, 0.3, 0.4, 0.5): that share of the GPU pods ask for more than one GPU. Single-GPU pods
  (whole or shared) are replaced, each with the probability that brings the share to the level, by copies of the
  trace's own multi-GPU pods (drawn at random, with their CPU and memory);
* ``sharing`` (0.4, 0.6, 0.8, 1.0): that share of the GPU pods share a GPU; non-sharing GPU pods are replaced by
  copies of the trace's sharing pods (or, below the trace's own share, sharing pods by copies of the others);
* ``model-constrained`` (0.1, 0.2, 0.25, 0.33): that share of the GPU pods get a ``gpu_spec`` naming one or two of
  the cluster's GPU models (drawn weighted by how many GPUs of each model exist, among the models with a node that
  has as many GPUs as the pod asks for);
* ``cpu-heavy`` (0.5, 1, 1.5, 2, 2.5): the CPU-only pods' total CPU demand is that multiple of the trace's: CPU-only
  pods are dropped at random (below 1) or copies of them drawn at random are added (above 1), in random positions.

Copies get names of their own (``<name>-v<i>``): the simulator counts a trace pod drawn again once, by name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..model import MILLI_PER_GPU
from .trace import Trace, TracePod

Build = Callable[[Trace, float, np.random.Generator], Trace]


def _is_multi(p: TracePod) -> bool:
    return p.num_gpu > 1


def _is_sharing(p: TracePod) -> bool:
    return p.num_gpu == 1 and p.gpu_milli < MILLI_PER_GPU


def _mix(trace: Trace, share: float, cls: Callable[[TracePod], bool], rng: np.random.Generator, what: str) -> Trace:
    """The trace with ``share`` of its GPU pods in class ``cls`` (in expectation): pods of the other GPU pods are
    replaced by copies of the class's pods, or (to lower the share) the class's pods by copies of the others."""
    gpu = [p for p in trace.pods if p.num_gpu > 0]
    inside = [p for p in gpu if cls(p)]
    outside = [p for p in gpu if not cls(p)]
    if not gpu:
        raise ValueError(f"the trace has no GPU pods to make {what}")
    now = len(inside) / len(gpu)
    if share > now:
        if not inside:
            raise ValueError(f"the trace has no {what} pods to copy")
        source, flip, prob = inside, outside, (share - now) / (1.0 - now)
    else:
        if share < now and not outside:
            raise ValueError(f"the trace has only {what} pods")
        source, flip, prob = outside, inside, (now - share) / now if now > 0 else 0.0
    flip_ids = {id(p) for p in flip}
    pods: list[TracePod] = []
    for i, p in enumerate(trace.pods):
        if id(p) in flip_ids and rng.random() < prob:
            src = source[int(rng.integers(len(source)))]
            p = replace(src, name=f"{src.name}-v{i}")
        pods.append(p)
    return Trace(trace.nodes, tuple(pods))


def multi_gpu(trace: Trace, share: float, rng: np.random.Generator) -> Trace:
    return _mix(trace, share, _is_multi, rng, "multi-GPU")


def sharing(trace: Trace, share: float, rng: np.random.Generator) -> Trace:
    return _mix(trace, share, _is_sharing, rng, "GPU-sharing")


def model_constrained(trace: Trace, share: float, rng: np.random.Generator) -> Trace:
    gpus = Counter[str]()
    widest = Counter[str]()
    for n in trace.nodes:
        if n.gpus:
            gpus[n.model] += n.gpus
            widest[n.model] = max(widest[n.model], n.gpus)
    if not gpus:
        raise ValueError("the trace has no GPU nodes to pin pods to")
    pods = []
    for p in trace.pods:
        if p.num_gpu > 0 and rng.random() < share:
            # only models with a node wide enough for the pod: a pin nothing can satisfy says nothing about placement
            models = sorted(m for m in gpus if widest[m] >= p.num_gpu)
            weights = np.array([gpus[m] for m in models], dtype=np.float64)
            k = 1 if len(models) == 1 or rng.random() < 0.5 else 2
            spec = frozenset(str(m) for m in rng.choice(models, size=k, replace=False, p=weights / weights.sum()))
            p = replace(p, gpu_spec=spec)
        pods.append(p)
    return Trace(trace.nodes, tuple(pods))


def cpu_heavy(trace: Trace, factor: float, rng: np.random.Generator) -> Trace:
    cpu_only = [i for i, p in enumerate(trace.pods) if p.num_gpu == 0]
    if not cpu_only:
        raise ValueError("the trace has no CPU-only pods to scale")
    goal = factor * sum(trace.pods[i].cpu_milli for i in cpu_only)
    pods = list(trace.pods)
    total = sum(trace.pods[i].cpu_milli for i in cpu_only)
    if factor < 1:
        drop: set[int] = set()
        for i in rng.permutation(cpu_only).tolist():
            if total <= goal:
                break
            drop.add(int(i))
            total -= trace.pods[int(i)].cpu_milli
        return Trace(trace.nodes, tuple(p for i, p in enumerate(pods) if i not in drop))
    extra: list[TracePod] = []
    while total < goal:
        src = trace.pods[cpu_only[int(rng.integers(len(cpu_only)))]]
        extra.append(replace(src, name=f"{src.name}-v{len(extra)}"))
        total += src.cpu_milli
    at = rng.integers(0, len(pods) + 1, size=len(extra))
    order = np.argsort(np.r_[np.arange(len(pods)) * 1.0, at - 0.5], kind="stable")
    merged = [*pods, *extra]
    return Trace(trace.nodes, tuple(merged[int(i)] for i in order))


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    label: str
    """What the level measures, for tables (``{level}`` is replaced)."""
    levels: tuple[float, ...]
    build: Build
    low: float
    high: float
    """The levels allowed (inclusive)."""

    def describe_level(self, level: float) -> str:
        return self.label.format(level=level, pct=100 * level)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("multi-gpu", "{pct:.0f} % of GPU pods multi-GPU", (0.2, 0.3, 0.4, 0.5), multi_gpu, 0.0, 1.0),
        Family("sharing", "{pct:.0f} % of GPU pods sharing", (0.4, 0.6, 0.8, 1.0), sharing, 0.0, 1.0),
        Family(
            "model-constrained",
            "{pct:.0f} % of GPU pods pinned",
            (0.1, 0.2, 0.25, 0.33),
            model_constrained,
            0.0,
            1.0,
        ),
        Family("cpu-heavy", "CPU-only demand x{level:g}", (0.5, 1.0, 1.5, 2.0, 2.5), cpu_heavy, 0.0, 10.0),
    )
}


def variant(trace: Trace, family: str, level: float | None = None, seed: int = 0) -> Trace:
    """Family ``family`` at ``level`` (default: the family's highest level) of ``trace``, built with ``seed``."""
    try:
        fam = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown variant family {family!r} (known: {', '.join(FAMILIES)})") from None
    lv = fam.levels[-1] if level is None else float(level)
    if not fam.low <= lv <= fam.high:
        raise ValueError(f"variant {family}: level {lv:g} is outside {fam.low:g}..{fam.high:g}")
    return fam.build(trace, lv, np.random.default_rng([seed, 99]))


def variants(families: Sequence[str] | None = None) -> list[tuple[str, float]]:
    """Every (family, level) of ``families`` (default: all), in order."""
    names = list(FAMILIES) if families is None else list(families)
    for n in names:
        if n not in FAMILIES:
            raise ValueError(f"unknown variant family {n!r} (known: {', '.join(FAMILIES)})")
    return [(n, lv) for n in names for lv in FAMILIES[n].levels]


def describe(trace: Trace) -> str:
    n = len(trace.pods)
    cpu = sum(p.num_gpu == 0 for p in trace.pods)
    gpu = n - cpu
    share = sum(_is_sharing(p) for p in trace.pods)
    multi = sum(_is_multi(p) for p in trace.pods)
    spec = sum(p.gpu_spec is not None for p in trace.pods)
    cpu_demand = sum(p.cpu_milli for p in trace.pods if p.num_gpu == 0) / 1000
    g = max(gpu, 1)
    return (
        f"{n} pods: {100 * cpu / n:.1f} % CPU-only ({cpu_demand:,.0f} cores); of the GPU pods "
        f"{100 * share / g:.1f} % sharing, {100 * multi / g:.1f} % multi-GPU, {100 * spec / g:.1f} % pinned"
    )


def thinned(trace: Trace, every: int) -> Trace:
    """Every ``every``-th node (ordered by GPU model, then name, so each model keeps its share of the fleet) and
    every ``every``-th pod: the same mix on a cluster ``every`` times smaller, for runs the CPU budget allows."""
    if every < 1:
        raise ValueError(f"every must be at least 1, got {every}")
    if every == 1:
        return trace
    nodes = sorted(trace.nodes, key=lambda n: (n.model, n.name))[::every]
    return Trace(tuple(nodes), trace.pods[::every])
