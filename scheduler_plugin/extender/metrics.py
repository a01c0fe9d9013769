"""The extender's Prometheus metrics (names from docs/metrics.md), on a registry owned by one app instance."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..policies.base import RejectionKind

VERBS = ("filter", "prioritize", "bind", "explain", "preempt")
RESULTS = ("passed", "rejected", "scored", "bound", "error")
#: The ``reason`` label values of ``kelvin_extender_rejections_total``: every kind a filter or the extender reports
#: (the simulator's NodeResourcesFit is never behind the extender).
REASONS = tuple(k.value for k in RejectionKind if k is not RejectionKind.NODE_RESOURCES)

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
