"""The extender's Prometheus metrics (names from docs/metrics.md), on a registry owned by one app instance."""

from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

VERBS = ("filter", "prioritize", "bind", "explain", "preempt")
RESULTS = ("passed", "rejected", "scored", "bound", "error")
REASONS = (
    "gpu_memory",
    "gpu_count",
    "gpu_model",
    "topology",
    "thermal",
    "stale_telemetry",
    "preemption_pending",
    "unknown_node",
    "bad_request",
)

#: Extender calls are sub-millisecond to tens of milliseconds; kube-scheduler's default httpTimeout is 5 s.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.duration = Histogram(
            "kelvin_extender_request_duration_seconds",
            "Time to answer an extender call, per verb.",
            ["verb"],
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.requests = Counter(
            "kelvin_extender_requests",
            "Extender calls answered, per verb and HTTP status code.",
            ["verb", "code"],
            registry=registry,
        )
        self.decisions = Counter(
            "kelvin_extender_decisions",
            "Per-node decisions (filter: passed/rejected; prioritize: scored; bind: bound/error; preempt: passed, a "
            "node kept with its victims / rejected, a node left out).",
            ["verb", "result"],
            registry=registry,
        )
        self.rejections = Counter(
            "kelvin_extender_rejections",
            "Nodes rejected by filter, per reason.",
            ["reason"],
            registry=registry,
        )
        self.assumed = Gauge(
            "kelvin_extender_assumed_allocations",
            "Entries in the assumed-allocation ledger.",
            registry=registry,
        )
        self.preempt_victims = Counter(
            "kelvin_extender_preemption_victims",
            "Pods the preempt verb named as victims (on the nodes it kept).",
            registry=registry,
        )
        self.preempt_unknown = Counter(
            "kelvin_extender_preemption_unknown",
            "Nodes or victims in a preempt request that kelvin has no record of (reported and left out).",
            ["kind"],
            registry=registry,
        )
        for kind in ("node", "pod"):
            self.preempt_unknown.labels(kind)
        for verb in VERBS:
            self.duration.labels(verb)
            for result in RESULTS:
                self.decisions.labels(verb, result)
        for reason in REASONS:
            self.rejections.labels(reason)


@functools.lru_cache(maxsize=4096)
def rejection_code(reason: str) -> str:
    """The ``reason`` label of a filter rejection, from the words the fit and telemetry filters use.

    The framework reports rejections as operator text only; this maps each wording family to its label (see
    ``policies/fit.py``). Text that matches no family counts as ``gpu_count``.
    """
    r = reason.lower()
    if "telemetry" in r:
        return "stale_telemetry"
    if "nvlink" in r:
        return "topology"
    if "cool enough" in r or "throttl" in r or "°c" in r:
        return "thermal"
    if " of model " in r:
        return "gpu_model"
    if "gib free" in r or "largest allowed gpu" in r or "of its capacity free" in r:
        return "gpu_memory"
    return "gpu_count"
