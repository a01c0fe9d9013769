"""The operator's Prometheus metrics (exactly the operator section of docs/metrics.md), pre-initialised at 0."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

EVICTION_REASONS = ("thermal", "noisy_neighbor", "memory_pool")
EVICTION_RESULTS = ("evicted", "pdb_blocked", "error", "dry_run", "limited")
GANG_REPLAN_OUTCOMES = ("replanned", "waiting")
GANG_MOVE_RESULTS = ("evicted", "partly", "checkpoint_pending", "protected", "limited", "dry_run")
HANDSHAKE_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        r = self.registry
        self.evictions = Counter(
            "kelvin_operator_evictions",
            "Eviction attempts by reason and result.",
            ["reason", "result", "dry_run"],
            registry=r,
        )
        self.taint_transitions = Counter(
            "kelvin_operator_taint_transitions",
            "Thermal taints added to or removed from nodes.",
            ["transition"],
            registry=r,
        )
        self.hot_nodes = Gauge("kelvin_operator_hot_nodes", "Nodes currently hot.", registry=r)
        self.handshake = Histogram(
            "kelvin_operator_checkpoint_handshake_duration_seconds",
            "From checkpoint request to checkpoint-done (or to the timeout).",
            ["outcome"],
            buckets=HANDSHAKE_BUCKETS,
            registry=r,
        )
        self.pool_violations = Counter(
            "kelvin_operator_pool_violations",
            "Pods seen over their GPU memory pool.",
            ["mode", "kind"],
            registry=r,
        )
        self.webhook_requests = Counter(
            "kelvin_operator_webhook_requests",
            "Admission requests by webhook and result.",
            ["webhook", "result"],
            registry=r,
        )
        self.gang_replans = Counter(
            "kelvin_operator_gang_replans",
            "Gang plans found stale before every member bound, by outcome (re-planned, or waiting for room).",
            ["outcome"],
            registry=r,
        )
        self.gang_moves = Counter(
            "kelvin_operator_gang_moves",
            "Running gangs with a straggling member handled as a whole, by result.",
            ["result"],
            registry=r,
        )
        for outcome in GANG_REPLAN_OUTCOMES:
            self.gang_replans.labels(outcome)
        for result in GANG_MOVE_RESULTS:
            self.gang_moves.labels(result)
        for reason in EVICTION_REASONS:
            for result in EVICTION_RESULTS:
                for dry in ("true", "false"):
                    self.evictions.labels(reason, result, dry)
        for t in ("added", "removed"):
            self.taint_transitions.labels(t)
        for outcome in ("done", "timeout"):
            self.handshake.labels(outcome)
        for mode in ("audit", "warn", "evict"):
            for kind in ("over_pool", "failed_open"):
                self.pool_violations.labels(mode, kind)
        for hook in ("validate", "mutate"):
            for res in ("allowed", "denied", "error"):
                self.webhook_requests.labels(hook, res)
