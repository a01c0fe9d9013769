"""kopf wiring: handlers of a few lines that call the reconciler and the pure admission code.

:func:`build_registry` registers everything on a fresh ``kopf.OperatorRegistry`` for one configuration (timer
intervals are fixed at registration). Shared state lives in ``memo.runtime``; pods are found through the
``pods_by_node`` index, never by listing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from scheduler_plugin.gang import cycle as gang_cycle
from scheduler_plugin.kubeapi import KubeConfig
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.pod import RequestError

from . import gangs, webhooks
from .gang_loop import GangLoop
from .logs import demote_kopf_success
from .runtime import Runtime, operator_kube, webhook_cert
from .settings import OperatorConfig
from .webhook_server import AdmissionServer

log = logging.getLogger("kelvin.operator")

RuntimeFactory = Callable[[OperatorConfig], Awaitable[Runtime]]

#: The operations both webhooks judge: the chart's webhook configurations send pods on CREATE only. A review of any
#: other operation (UPDATE, DELETE, CONNECT) is admitted as it is.
JUDGED_OPERATIONS: tuple[kopf.Operation, ...] = ("CREATE",)
#: Seconds between two planning passes over the gated gangs (a gang that does not fit is retried as capacity frees
#: up); a pass runs from the node timer, so at most every ``interval_s`` when that is longer.
GANG_INTERVAL_S = 5.0
#: The webhooks' handler ids, which are their paths (/gpu-memory, /gpu-env: the chart's webhook configurations).
VALIDATING_ID, MUTATING_ID = "gpu-memory", "gpu-env"


def _gpu_pod(spec: kopf.Spec, annotations: kopf.Annotations, **_: Any) -> bool:
    """Pods worth indexing: they request GPUs or carry a kelvin GPU annotation, and are bound to a node."""
    if not spec.get("nodeName"):
        return False
    if ann.GPU_MEMORY in annotations or ann.GPU_SHARE in annotations:
        return True
    try:
        return webhooks.requests_gpu_resource({"spec": spec})
    except RequestError:
        return True  # unreadable containers: indexed, so that its view names the error (PodView.request_error)


def _node_labels(kwargs: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The Node objects' labels from the ``node_labels`` index (node -> labels), which every handler receives: the
    gang levels' labels are on the Node objects, not in every telemetry source's snapshot."""
    labels: kopf.Index[str, Any] | None = kwargs.get("node_labels")
    return {n: dict(next(iter(v), {})) for n, v in labels.items()} if labels is not None else {}


def _gated_gang_pod(spec: kopf.Spec, **_: Any) -> bool:
    """Pods held by kelvin's gang gate (not yet planned)."""
    return any(g.get("name") == ann.GANG_SCHEDULING_GATE for g in spec.get("schedulingGates") or [])


def _placed_gang_pod(spec: kopf.Spec, annotations: kopf.Annotations, **_: Any) -> bool:
    """Pods past kelvin's gang gate that may be gang members: planned by kelvin, or bound (the index reads the gang)."""
    if _gated_gang_pod(spec):
        return False
    return bool(spec.get("nodeName")) or ann.GANG_PLANNED_NODE in annotations


def _gpu_node(body: kopf.Body, **_: Any) -> bool:
    """Nodes worth a cycle: they have GPUs (capacity), or still carry kelvin's thermal taint."""
    capacity = (body.get("status") or {}).get("capacity") or {}
    if any(str(capacity.get(r, "0")) not in ("", "0") for r in webhooks.GPU_RESOURCES):
        return True
    taints = (body.get("spec") or {}).get("taints") or []
    return any(t.get("key") == ann.THERMAL_TAINT_KEY for t in taints)


def build_registry(  # noqa: C901
    cfg: OperatorConfig,
    start_runtime: RuntimeFactory,
    kube_config: KubeConfig,
    *,
    on_failure: Callable[[str], None] | None = None,
) -> kopf.OperatorRegistry:
    """``on_failure``: told (once, with a message naming the setting) when the webhook server cannot start; the
    caller stops the operator (``None``: the server raises, and kopf stops with its traceback)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # the same credentials as kelvin's own client (in-cluster service account, kubeconfig, or a test server)
        return kopf.ConnectionInfo(
            server=kube_config.server,
            token=kube_config.token,
            ca_path=kube_config.ca_file,
            certificate_path=kube_config.cert_file,
            private_key_path=kube_config.key_file,
            insecure=kube_config.insecure or None,
            scheme="Bearer" if kube_config.token else None,
        )

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.peering.name = cfg.peering
        settings.peering.standalone = cfg.standalone
        settings.posting.level = logging.WARNING
        demote_kopf_success()  # "Timer 'node_cycle' succeeded." once per node per cycle: DEBUG, not INFO
        settings.scanning.disabled = True  # no CRDs of our own: no need to watch CustomResourceDefinitions
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="operator.kelvin.dev")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="operator.kelvin.dev")
        if cfg.webhook.enabled:
            certfile, pkeyfile = webhook_cert(cfg.webhook)
            settings.admission.server = AdmissionServer(
                on_failure=on_failure,
                webhooks=(VALIDATING_ID, MUTATING_ID),
                addr=cfg.webhook.addr,
                port=cfg.webhook.port,
                host=cfg.webhook.host,
                certfile=str(certfile),
                pkeyfile=str(pkeyfile),
            )
            settings.admission.managed = cfg.webhook.managed
        memo.runtime = await start_runtime(cfg)
        # one planner loop per operator, made here: kopf gives every object's handlers a shallow copy of this memo,
        # so an attribute set later in one node's timer would be that node's own, and every node would plan each gang
        memo.gangs = GangLoop(
            cfg, operator_kube(cfg, memo.runtime.client), GANG_INTERVAL_S, memo.runtime.reconciler.metrics
        )
        log.info(
            "kelvin operator started (dry_run=%s, peering=%s)",
            cfg.dry_run,
            "standalone" if cfg.standalone else cfg.peering,
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        rt: Runtime | None = getattr(memo, "runtime", None)
        if rt is not None:
            await rt.close()

    @kopf.index("pods", id="pods_by_node", registry=registry, when=_gpu_pod)
    def pods_by_node(spec: kopf.Spec, body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        return {str(spec["nodeName"]): dict(body)}

    @kopf.timer("nodes", id="node_cycle", registry=registry, interval=cfg.interval_s, when=_gpu_node)
    async def node_cycle(name: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
        rt: Runtime = memo.runtime
        index: kopf.Index[str, Any] = kwargs["pods_by_node"]
        pods = [dict(p) for p in index.get(name, [])]
        gangs_index: kopf.Index[str, Any] | None = kwargs.get("placed_gangs")  # read only for gangs with a member here
        await rt.reconciler.reconcile_node(dict(body), rt.snapshot().node(name), pods, time.time(), gangs_index)
        await _plan_gangs(memo, kwargs)

    async def _plan_gangs(memo: kopf.Memo, kwargs: dict[str, Any]) -> None:
        """Plan the gated gangs (docs/jobs.md), at most every GANG_INTERVAL_S whichever node's cycle runs: no timer
        on the pods themselves (a kopf timer puts a finalizer on every object it runs for)."""
        rt: Runtime = memo.runtime
        loop: GangLoop = memo.gangs
        now = time.time()
        if not loop.due(now):
            return
        gated: kopf.Index[str, Any] = kwargs["gated_gangs"]
        node_labels = _node_labels(kwargs)
        for key in list(gated):
            await loop.run([dict(p) for p in gated.get(key, [])], rt.snapshot(), node_labels, now)
        placed: kopf.Index[str, Any] | None = kwargs.get("placed_gangs")
        for key in list(placed or ()):
            members = [dict(p) for p in (placed.get(key, []) if placed is not None else [])]
            if any(not (p.get("spec") or {}).get("nodeName") for p in members):  # a member waits on its plan
                await loop.replan(members, rt.snapshot(), node_labels, now)

    @kopf.index("nodes", id="node_labels", registry=registry)
    def node_labels(name: str, labels: kopf.Labels, **_: Any) -> dict[str, dict[str, str]]:
        return {name: dict(labels)}

    @kopf.index("pods", id="gated_gangs", registry=registry, when=_gated_gang_pod)
    def gated_gangs(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        member = gang_cycle.gated_member(dict(body), cfg.gang)
        return {member.ref.key: dict(body)} if member is not None else {}

    @kopf.index("pods", id="placed_gangs", registry=registry, when=_placed_gang_pod)
    def placed_gangs(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        member = gang_cycle.placed_member(dict(body), cfg.gang)
        return {member.ref.key: dict(body)} if member is not None else {}

    if cfg.webhook.enabled:
        # kopf runs a handler for every operation of the resource (``operations`` only shapes the webhook
        # configurations it manages): the operations the chart does not register are admitted unjudged.
        @kopf.on.validate("pods", id=VALIDATING_ID, operations=list(JUDGED_OPERATIONS), registry=registry)
        def validate_pod(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
            rt: Runtime = memo.runtime
            if kwargs.get("operation") not in JUDGED_OPERATIONS:
                rt.metrics.webhook_requests.labels("validate", "allowed").inc()
                return
            try:
                message = webhooks.validate(
                    dict(body),
                    webhooks.GpuSizes.of(rt.snapshot()),
                    shared_gpu_resource=cfg.webhook.shared_gpu_resource,
                ) or gangs.refusal(dict(body), cfg.gang, rt.snapshot(), _node_labels(kwargs))
            except Exception:
                rt.metrics.webhook_requests.labels("validate", "error").inc()
                raise
            rt.metrics.webhook_requests.labels("validate", "denied" if message else "allowed").inc()
            if message:
                meta = body.get("metadata") or {}
                namespace = meta.get("namespace") or kwargs.get("namespace") or ""
                name = meta.get("name") or meta.get("generateName") or ""  # a Deployment's pods: generateName only
                log.info("refused pod %s/%s at admission: %s", namespace, name, message)
                raise kopf.AdmissionError(message, code=400)

        @kopf.on.mutate("pods", id=MUTATING_ID, operations=list(JUDGED_OPERATIONS), registry=registry)
        def mutate_pod(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
            rt: Runtime = memo.runtime
            if kwargs.get("operation") not in JUDGED_OPERATIONS:
                rt.metrics.webhook_requests.labels("mutate", "allowed").inc()
                return
            try:
                containers = webhooks.mutate(
                    dict(body),
                    snapshot=rt.snapshot(),
                    mps_label=cfg.webhook.mps_label,
                    framework_env=cfg.webhook.framework_env,
                    shared_gpu_resource=cfg.webhook.shared_gpu_resource,
                )
                gates = gangs.gated(dict(body), cfg.gang) if cfg.webhook.gang_gates else None
            except Exception:
                rt.metrics.webhook_requests.labels("mutate", "error").inc()
                raise
            rt.metrics.webhook_requests.labels("mutate", "allowed").inc()
            if containers is not None:
                patch.spec["containers"] = containers
            if gates is not None:
                patch.spec["schedulingGates"] = gates

    return registry
