"""Workload variants built from a trace, to check that a policy is not tuned to one file.

Each variant is a pure, seeded transformation of the pod list (the nodes stay):

* ``multi-gpu``: 30 % of the one-whole-GPU pods become 2-, 4- or 8-GPU pods (CPU and memory scaled);
* ``sharing``: half of the one-whole-GPU pods become GPU-sharing pods, with shares drawn from the trace's own
  sharing pods;
* ``model-constrained``: 40 % of the GPU pods get a ``gpu_spec`` naming one or two of the cluster's GPU models
  (weighted by how many GPUs of each model exist);
* ``cpu-heavy``: CPU-only pods triple (copies of the trace's CPU-only pods) and GPU pods ask 1.5x the CPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..model import MILLI_PER_GPU
from .trace import Trace

Variant = Callable[[Trace, np.random.Generator], Trace]


def multi_gpu(trace: Trace, rng: np.random.Generator) -> Trace:
    pods = []
    for p in trace.pods:
        if p.num_gpu == 1 and p.gpu_milli == MILLI_PER_GPU and rng.random() < 0.3:
            n = int(rng.choice([2, 4, 8], p=[0.5, 0.3, 0.2]))
            p = replace(p, num_gpu=n, cpu_milli=p.cpu_milli * n, memory_bytes=p.memory_bytes * n)
        pods.append(p)
    return Trace(trace.nodes, tuple(pods))


def sharing(trace: Trace, rng: np.random.Generator) -> Trace:
    shares = [p.gpu_milli for p in trace.pods if p.num_gpu == 1 and p.gpu_milli < MILLI_PER_GPU]
    if not shares:
        shares = [250, 500]
    pods = []
    for p in trace.pods:
        if p.num_gpu == 1 and p.gpu_milli == MILLI_PER_GPU and rng.random() < 0.5:
            p = replace(p, gpu_milli=int(rng.choice(shares)))
        pods.append(p)
    return Trace(trace.nodes, tuple(pods))


def model_constrained(trace: Trace, rng: np.random.Generator) -> Trace:
    gpus = Counter[str]()
    for n in trace.nodes:
        if n.gpus:
            gpus[n.model] += n.gpus
    models = sorted(gpus)
    weights = np.array([gpus[m] for m in models], dtype=np.float64)
    weights /= weights.sum()
    pods = []
    for p in trace.pods:
        if p.num_gpu > 0 and rng.random() < 0.4:
            k = 1 if len(models) == 1 or rng.random() < 0.5 else 2
            spec = frozenset(str(m) for m in rng.choice(models, size=k, replace=False, p=weights))
            p = replace(p, gpu_spec=spec)
        pods.append(p)
    return Trace(trace.nodes, tuple(pods))


def cpu_heavy(trace: Trace, rng: np.random.Generator) -> Trace:
    cpu_only = [p for p in trace.pods if p.num_gpu == 0]
    pods = [replace(p, cpu_milli=p.cpu_milli * 3 // 2) if p.num_gpu else p for p in trace.pods]
    for i in range(2 * len(cpu_only)):
        src = cpu_only[int(rng.integers(len(cpu_only)))]
        pods.append(replace(src, name=f"{src.name}-cpu{i}"))
    order = rng.permutation(len(pods))
    return Trace(trace.nodes, tuple(pods[int(i)] for i in order))


VARIANTS: dict[str, Variant] = {
    "multi-gpu": multi_gpu,
    "sharing": sharing,
    "model-constrained": model_constrained,
    "cpu-heavy": cpu_heavy,
}


def variant(trace: Trace, name: str, seed: int = 0) -> Trace:
    try:
        fn = VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r} (known: {', '.join(VARIANTS)})") from None
    return fn(trace, np.random.default_rng([seed, 99]))


def describe(trace: Trace) -> str:
    n = len(trace.pods)
    cpu = sum(p.num_gpu == 0 for p in trace.pods)
    share = sum(p.num_gpu == 1 and p.gpu_milli < MILLI_PER_GPU for p in trace.pods)
    multi = sum(p.num_gpu > 1 for p in trace.pods)
    spec = sum(p.gpu_spec is not None for p in trace.pods)
    return (
        f"{n} pods: {100 * cpu / n:.1f} % CPU-only, {100 * share / n:.1f} % sharing, "
        f"{100 * multi / n:.1f} % multi-GPU, "
        f"{100 * spec / n:.1f} % model-constrained"
    )
