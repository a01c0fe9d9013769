"""The extender verbs: filter, prioritize, bind and explain over the current snapshot (no HTTP here).

Each verb reads ``cache.snapshot`` once (immutable), parses the pod into a :class:`GpuRequest` and hands the
candidate rows to the policy :class:`Framework`. Nodes kelvin has no telemetry for at all ("unknown") follow the
policy's ``telemetry.onStale``: ``deny`` fails them (unresolvable, so preemption is not tried there), ``allow``
passes them with score 0. A pod whose kelvin annotations are malformed fails every node as unresolvable, with the
annotation and value named: the scheduler shows that text on the pod, does not preempt for it, and (unlike an
``Error`` reply) does not skip the extender when it is ``ignorable``.

A telemetry **outage** is different (:meth:`Extender.outage`): when, under ``deny``, kelvin's telemetry is stale as a
whole (the last successful refresh is older than ``maxAgeSeconds``, there has been none yet, it reported no node, or
no node of the snapshot has telemetry younger than that), a GPU pod's filter is answered with ``Error`` instead of
failing every node. kube-scheduler puts a pod whose nodes all failed in its unschedulable queue, retried only on a
cluster event or its 5-minute flush, but retries a scheduling error with backoff (``podMaxBackoffSeconds``, 10 s):
the pod is placed within seconds of the telemetry recovering. A node stale on its own while others are fresh still
fails the filter, except within ``maxAgeSeconds`` of the end of an outage (:meth:`Extender.just_back`: Prometheus
scrapes the exporters again one by one): a pod whose candidates all failed for stale or missing telemetry alone then
gets an ``Error`` too (:meth:`Extender.candidates_stale`), not parked while its nodes are about to report again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt
import orjson

from ..gang.plan_check import PlannedOn
from ..gang.planner import GangPlanner
from ..model import GpuAssignment, GpuRequest, RequestError, parse_pod, pod_key
from ..model.claim import claim_of
from ..model.snapshot import FleetArrays, IndexKey, Snapshot
from ..policies.base import MAX_EXTENDER_PRIORITY, IntA, Rejection, RejectionKind
from ..policies.framework import Framework
from ..policies.ledger import AssumedLedger
from ..policies.plugins import PRODUCTION
from ..policies.policy_file import PolicyConfig
from ..policies.registry import Registry
from ..settings import Settings
from ..telemetry.cache import SnapshotCache
from ..telemetry.source import TelemetrySource
from . import gangs, wire
from .binder import Binder, BindError
from .bindings import BindRecord, BindRecords, BindState
from .errors import WireError
from .gang_explain import explain_gang
from .metrics import ExtenderMetrics
from .node_labels import NodeLabelLister
from .pdb_lister import PdbLister
from .pod_requests import PodRequests
from .preempt_pending import PendingPreemptions
from .turns import LoopTurns

log = logging.getLogger(__name__)

UNKNOWN_NODE_REASON = "kelvin has no GPU telemetry for this node (not in the snapshot)"
#: Appended to an outage's ``Error``: what kube-scheduler does with the pod.
OUTAGE_RETRY = "the pod is retried with backoff"
#: Rejections that only say kelvin lacks the node's current telemetry: when every candidate failed for one of these
#: right after an outage, the filter answers ``Error`` (:meth:`Extender.candidates_stale`).
NO_TELEMETRY_KINDS = frozenset({RejectionKind.STALE_TELEMETRY, RejectionKind.UNKNOWN_NODE})

V = TypeVar("V")


@runtime_checkable
class BindingObserver(Protocol):
    """A source that must learn of binds to show them (the simulated fleet)."""

    def record_binding(self, node: str, assignment: GpuAssignment) -> None: ...


class PodMemo(Generic[V]):
    """What filter or prioritize read from a pod, for bind (whose body carries no pod), by the pod's UID and by its
    ``namespace/name``. Bounded LRU."""

    def __init__(self, size: int = 20_000) -> None:
        self.size = size
        self._d: OrderedDict[str, tuple[str, V]] = OrderedDict()

    def put(self, uid: str, pod_key: str, value: V) -> None:
        for key in (uid, pod_key):
            if key:
                self._d[key] = (uid, value)
                self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def forget(self, uid: str, pod_key: str) -> None:
        """Drop what was kept for this pod (its UID and its name, when the name is still this pod's)."""
        if uid:
            self._d.pop(uid, None)
        got = self._d.get(pod_key)
        if got is not None and (not uid or not got[0] or got[0] == uid):
            del self._d[pod_key]

    def get(self, uid: str, pod_key: str) -> V | None:
        got = self._d.get(uid) if uid else None
        if got is None:
            got = self._d.get(pod_key)
            if got is not None and uid and got[0] and got[0] != uid:
                return None  # same name, another pod
        return None if got is None else got[1]


class RequestMemo(PodMemo[GpuRequest]):
    """Pod requests parsed by filter/prioritize, for bind."""

    def remember(self, req: GpuRequest) -> None:
        self.put(req.pod_uid, req.pod_key, req)


class _BindFailed(Exception):
    """A bind attempt that failed: the message is the reply's ``Error``; ``state`` is what its record becomes
    (``None``: the bind certainly did not happen, the record is dropped)."""

    def __init__(self, message: str, state: BindState | None = None) -> None:
        super().__init__(message)
        self.state = state


def _gpus_text(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus)) or "-"


def bind_refused(exc: BindError) -> bool:
    """Whether the API server certainly did not apply the Binding, so that its GPUs can be released at once.

    Not so (the GPUs stay assumed until the pod listing or the ledger's TTL settles it): no answer (status 0: a
    connection reset after the request may have been sent), a 5xx (504: the write may still land), and a 409 "pod X is
    already assigned to node Y" (an earlier attempt whose answer was lost may have bound it, with these GPUs). Any
    other answer (404 pod gone, 409 UID precondition failed, 400/403/422/429) is a refusal, as is a failure before any
    request reached the API server (status None: kelvin refused, or no connection could be made).
    """
    status = exc.status
    if status is None:
        return True
    if status == 0 or status >= 500:
        return False
    return not (status == 409 and "already assigned" in str(exc))


_REASON = operator.attrgetter("reason")
_UNRESOLVABLE = operator.attrgetter("unresolvable")


#: Snapshot index: the fleet's names as an object array, by row (numpy picks thousands of them ten times faster than
#: a ``map`` over the names tuple).
_NAMES = IndexKey[npt.NDArray[np.object_]]("extender.names", ())


def _names_array(fleet: FleetArrays) -> npt.NDArray[np.object_]:
    return fleet.derive(_NAMES, lambda f: np.array(f.names, dtype=object))


def _rejected(
    fleet: FleetArrays, rows: IntA, rejections: Sequence[Rejection]
) -> tuple[dict[str, str], dict[str, str], Counter[RejectionKind]]:
    """The ``FailedNodes`` and ``FailedAndUnresolvableNodes`` of the ``fleet`` rows the filters rejected
    (``rejections``: why each row failed, in the same order), and how many rejections of each kind. Thousands of
    nodes can fail one pod; a rejection's kind and resolvability are fixed by its class (a handful per pod), so they
    are counted per class and the rest are C-level passes (numpy, ``map``, a ``Counter`` of classes, a dict made from
    zipped lists), never a Python loop per name."""
    counts: Counter[RejectionKind] = Counter()
    if not len(rejections):
        return {}, {}, counts
    by_class: Counter[type[Rejection]] = Counter(map(type, rejections))
    for cls, n in by_class.items():
        counts[cls.kind] += n
    names: list[str] = _names_array(fleet)[rows].tolist()
    reasons = list(map(_REASON, rejections))
    n_unres = sum(n for cls, n in by_class.items() if cls.unresolvable)
    if not n_unres:
        return dict(zip(names, reasons, strict=True)), {}, counts
    if n_unres == len(rejections):
        return {}, dict(zip(names, reasons, strict=True)), counts
    unres = list(map(_UNRESOLVABLE, rejections))
    res = list(map(operator.not_, unres))
    failed = dict(zip(itertools.compress(names, res), itertools.compress(reasons, res), strict=True))
    unresolvable = dict(zip(itertools.compress(names, unres), itertools.compress(reasons, unres), strict=True))
    return failed, unresolvable, counts


@dataclass
class Extender:
    """The extender's verbs (filter, prioritize, bind, explain) over the snapshot cache, without HTTP.

    Owns what one extender process keeps between requests: the framework and its ledger, the snapshot cache and its
    source, the binder (API server, local or none), the metrics, the parsed-request memo (bind's body carries no pod:
    it uses what filter or prioritize parsed) and the bind records (a retried bind is answered alike). Built by
    ``extender.app.build_extender`` from the settings; ``create_app``'s lifespan starts the cache's refresh task and
    stops it on shutdown. Every verb runs on the event loop, one at a time (:attr:`turn`), and reads
    ``cache.snapshot`` once, so a refresh published meanwhile never mixes two snapshots in one answer. Not
    thread-safe: only the body parsing of large requests runs in a worker thread (``routes.py``), before a verb is
    called."""

    settings: Settings
    policy: PolicyConfig
    framework: Framework
    ledger: AssumedLedger
    cache: SnapshotCache
    source: TelemetrySource
    binder: Binder
    metrics: ExtenderMetrics
    clock: Callable[[], float] = time.time
    plugins: Registry = PRODUCTION
    """The registry the policy was built from (the preempt verb builds its own framework from it too)."""
    pdbs: PdbLister | None = None
    """The PodDisruptionBudgets the preempt verb counts (listed when there is a Kubernetes API)."""
    node_labels: NodeLabelLister | None = None
    """The Node objects' topology labels explain's gang forecast plans with (listed when there is a Kubernetes API
    and the policy names ``gang.levels``)."""

    def __post_init__(self) -> None:
        self.memo = RequestMemo()
        #: The gang plans filter read from planned members' pods, for bind: the pod listing may not show a plan yet.
        self.plans: PodMemo[PlannedOn] = PodMemo()
        #: Pods parsed lately, by their JSON text: prioritize reuses what filter parsed (:mod:`.pod_requests`).
        self.pods = PodRequests()
        #: NodeNames lists seen lately, decoded and looked up once (kube-scheduler repeats them pod after pod).
        self.names = wire.NameCache()
        self.binds = BindRecords()
        #: Preemptions answered by the preempt verb, until kelvin's records show their victims gone
        #: (:mod:`.preempt_pending`).
        self.pending_preemptions = PendingPreemptions()
        #: One verb's CPU work per pass of the event loop, first come first served (:mod:`.turns`): between two
        #: verbs the loop accepts connections, reads sockets and answers /healthz.
        self.turn = LoopTurns()
        #: Deadline of one bind, counted from the request's arrival (``bind_timeout_s``, KELVIN_BIND_TIMEOUT_S): below
        #: kube-scheduler's extender httpTimeout (5 s by default).
        self.bind_timeout_s: float = self.settings.bind_timeout_s
        self._gang_planner: GangPlanner | None = None

    # -- helpers -----------------------------------------------------------------------------------------------

    @property
    def gang_planner(self) -> GangPlanner:
        """The gang planner over this extender's framework and ``gang:`` policy (built again when either changes)."""
        cached = self._gang_planner
        if cached is None or cached.fw is not self.framework or cached.policy is not self.policy.gang:
            cached = self._gang_planner = GangPlanner(self.framework, self.policy.gang)
        return cached

    def _listed_uids(self, node: str, now: float) -> set[str]:
        """UIDs of the pods kelvin's records show holding GPUs on ``node``: the snapshot's and the ledger's."""
        nd = self.cache.snapshot.node(node)
        listed = {a.pod_uid for a in nd.assignments if a.pod_uid} if nd is not None else set()
        listed.update(a.pod_uid for a in self.ledger.entries(now).get(node, ()) if a.pod_uid)
        return listed

    @property
    def deny_unknown(self) -> bool:
        return self.policy.telemetry.on_stale == "deny"

    def outage(self, stale: np.ndarray[Any, np.dtype[np.bool_]] | None, now: float) -> str | None:
        """Why kelvin's telemetry is stale as a whole, or None while it is not.

        An outage: the last successful refresh (the snapshot's ``taken_at``) is older than ``maxAgeSeconds`` (the
        source is failing); there has been no successful refresh yet; the snapshot has no node (the source answers
        with nothing, e.g. a restarted Prometheus before its first scrape); or every node of it is stale (``stale``,
        the cycle context's per-node mask over the whole fleet: the source answers but no exporter reaches it).
        Judged on the whole snapshot, never on the candidates of one request: a pod whose only candidate is a stale
        node among fresh ones is that node's problem, not an outage (but see :meth:`candidates_stale`, right after
        one). Only under ``onStale: deny`` (under ``allow`` stale nodes are judged on their last data).
        """
        if not self.deny_unknown:
            return None
        snap = self.cache.snapshot
        max_age = self.policy.telemetry.max_age_seconds
        age = snap.age_seconds(now)
        if not np.isfinite(age):
            why = self.cache.last_error or "waiting for the source"
            return f"kelvin has no GPU telemetry yet (no successful refresh from {snap.source}: {why}); {OUTAGE_RETRY}"
        if age > max_age:
            failing = f"; the source is failing: {self.cache.last_error}" if self.cache.last_error else ""
            return (
                f"kelvin's GPU telemetry is stale: last successful refresh {age:.0f} s ago (maxAgeSeconds "
                f"{max_age:g}){failing}; {OUTAGE_RETRY}"
            )
        if not snap.nodes:
            return (
                f"kelvin's GPU telemetry is empty: {snap.source} answered {age:.0f} s ago but reported no GPU node "
                f"(a restarted Prometheus before its first scrape, or no exporter scraped); {OUTAGE_RETRY}"
            )
        if stale is not None and stale.size and bool(stale.all()):
            return (
                f"kelvin's GPU telemetry is stale: no node of the {stale.size} in the snapshot has telemetry newer "
                f"than maxAgeSeconds ({max_age:g} s), though the source answers; {OUTAGE_RETRY}"
            )
        return None

    def just_back(self, now: float) -> bool:
        """Within ``maxAgeSeconds`` of the end of an outage (``SnapshotCache.after_outage``; the start counts)."""
        return self.cache.after_outage(now, self.policy.telemetry.max_age_seconds)

    def candidates_stale(self, counts: Counter[RejectionKind], now: float) -> str:
        """The ``Error`` of a filter :meth:`just_back` from an outage whose candidates all failed for missing
        telemetry alone (``counts``: only :data:`NO_TELEMETRY_KINDS`): the source has reported some nodes again,
        not yet these."""
        parts = []
        if n := counts[RejectionKind.STALE_TELEMETRY]:
            parts.append(f"{n} older than maxAgeSeconds {self.policy.telemetry.max_age_seconds:g} s or never reported")
        if n := counts[RejectionKind.UNKNOWN_NODE]:
            parts.append(f"{n} not in the snapshot")
        ago = now - self.cache.outage_ended_at
        return (
            f"kelvin's GPU telemetry is stale for every candidate node: {', '.join(parts)}; back {ago:.0f} s ago "
            f"from an outage, the source has not reported them again yet; {OUTAGE_RETRY}"
        )

    # -- filter ------------------------------------------------------------------------------------------------

    def filter(self, body: bytes | wire.ParsedArgs) -> dict[str, Any]:
        """An ``ExtenderFilterResult``. Raises :class:`~.errors.WireError` for a body that is not ExtenderArgs."""
        args = body if isinstance(body, wire.ParsedArgs) else wire.parse_args(body, names=self.names)
        names = args.names
        try:
            req = self.pods.request(args)
        except RequestError as exc:
            reason = f"invalid pod: {exc}"
            self.metrics.rejections.labels(RejectionKind.BAD_REQUEST).inc(len(names))
            self.metrics.decisions.labels("filter", "rejected").inc(len(names))
            return wire.filter_result(args, [], {}, dict.fromkeys(names, reason))
        self.memo.remember(req)
        # The one place a pod is learned (the target workload is the mix of arriving pods; see Framework.observe):
        # filter is the verb every managed pod reaches, fitting or not, with or without a prioritize verb.
        self.framework.observe(req)
        snap = self.cache.snapshot
        fleet = snap.arrays
        rows = args.name_list.rows(fleet.index)
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        passed_pos: IntA
        if not req.wants_gpu:
            passed_pos = np.arange(len(names), dtype=np.int64)
        else:
            now = self.clock()
            ctx = self.framework.context(fleet, now)
            down = self.outage(ctx.stale, now)
            if down is not None:  # a scheduling error: retried with backoff, not parked as unschedulable
                self.metrics.rejections.labels(RejectionKind.STALE_TELEMETRY).inc(len(names))
                self.metrics.decisions.labels("filter", "rejected").inc(len(names))
                return wire.filter_result(args, [], {}, {}, error=down)
            plan = gangs.plan_of(args.pod, req)
            if plan is None:
                self.plans.forget(req.pod_uid, req.pod_key)  # its plan withdrawn since: bind must not use it
            else:  # a gang member: its node was planned with the whole gang
                self.plans.put(req.pod_uid, req.pod_key, plan)
                passed, refused = gangs.planned_filter(plan, names, snap, self.gang_planner, ctx)
                self.metrics.decisions.labels("filter", "passed").inc(len(passed))
                self.metrics.decisions.labels("filter", "rejected").inc(len(refused))
                return wire.filter_result(args, passed, refused, {})
            known = rows >= 0
            pos_known = np.flatnonzero(known)
            outcome = self.framework.filter(req, fleet, rows[pos_known], ctx)
            ok = np.zeros(fleet.n_nodes, dtype=np.bool_)
            ok[outcome.passed] = True
            passed_pos = pos_known[ok[rows[pos_known]]]
            failed, unresolvable, counts = _rejected(fleet, outcome.rejected_rows, outcome.rejections)
            n_unknown = len(names) - len(pos_known)
            if n_unknown:
                unknown_pos = np.flatnonzero(~known)
                if self.deny_unknown:
                    unresolvable.update(dict.fromkeys(args.name_list.subset(unknown_pos), UNKNOWN_NODE_REASON))
                    counts[RejectionKind.UNKNOWN_NODE] = n_unknown
                else:
                    passed_pos = np.sort(np.concatenate([passed_pos, unknown_pos]))
            if not len(passed_pos):
                error = self._retry_error(req, failed, counts, now, len(names))
                if error is not None:  # a scheduling error: retried with backoff, not parked as unschedulable
                    self.metrics.decisions.labels("filter", "rejected").inc(len(names))
                    return wire.filter_result(args, [], {}, {}, error=error)
            elif req.pod_uid:
                self.pending_preemptions.forget(req.pod_uid)
            for kind, n in counts.items():
                self.metrics.rejections.labels(kind).inc(n)
        self.metrics.decisions.labels("filter", "passed").inc(len(passed_pos))
        self.metrics.decisions.labels("filter", "rejected").inc(len(failed) + len(unresolvable))
        return wire.filter_result(args, passed_pos, failed, unresolvable, names=self.names)

    def _retry_error(
        self, req: GpuRequest, failed: dict[str, str], counts: Counter[RejectionKind], now: float, n_names: int
    ) -> str | None:
        """When no candidate passed, the ``Error`` text that has kube-scheduler retry the pod with backoff instead of
        parking it as unschedulable (its reason going away is no cluster event), or None: right after an outage, when
        only telemetry not back yet keeps the pod off every candidate; or while the victims kelvin chose for it are
        still being deleted. Counts its rejections."""
        if counts and counts.keys() <= NO_TELEMETRY_KINDS and self.just_back(now):
            for kind, n in counts.items():
                self.metrics.rejections.labels(kind).inc(n)
            return self.candidates_stale(counts, now)
        if failed and req.pod_uid:
            wait = self.pending_preemptions.waiting(req.pod_uid, failed, lambda node: self._listed_uids(node, now), now)
            if wait is not None:
                self.metrics.rejections.labels(RejectionKind.PREEMPTION_PENDING).inc(n_names)
                return wait
        return None

    # -- prioritize --------------------------------------------------------------------------------------------

    def prioritize(self, body: bytes | wire.ParsedArgs) -> orjson.Fragment:
        """A ``HostPriorityList`` (as its JSON text). Raises :class:`~.errors.WireError` for a bad body or a pod kelvin
        cannot read (prioritize errors never block a pod: kube-scheduler ignores them)."""
        args = body if isinstance(body, wire.ParsedArgs) else wire.parse_args(body, names=self.names)
        try:
            req = self.pods.request(args)
        except RequestError as exc:
            raise WireError(f"Pod: {exc}") from None
        self.memo.remember(req)
        fleet = self.cache.snapshot.arrays
        rows = args.name_list.rows(fleet.index)
        scores = np.zeros(len(args.names), dtype=np.int64)
        pos_known = np.flatnonzero(rows >= 0)
        ranked = req.wants_gpu or bool(self.framework.cpu_only)
        cpu_nodes = not req.wants_gpu and ranked and pos_known.size < rows.size
        if cpu_nodes:
            # a node kelvin has no GPUs for (a CPU node): a pod without GPUs takes no GPU pod's CPU there, so every
            # CPU node comes first (kube-scheduler draws among them) and every GPU node below them
            scores[rows < 0] = MAX_EXTENDER_PRIORITY
        if pos_known.size and ranked:
            ctx = self.framework.context(fleet, self.clock())
            ints, _raw = self.framework.prioritize(req, fleet, rows[pos_known], ctx)
            scores[pos_known] = np.minimum(ints, MAX_EXTENDER_PRIORITY - 1) if cpu_nodes else ints
        self.metrics.decisions.labels("prioritize", "scored").inc(len(args.names))
        return orjson.Fragment(args.name_list.priority_json(scores))

    # -- bind --------------------------------------------------------------------------------------------------

    async def bind(self, body: bytes | wire.ExtenderBindingArgs, arrived: float | None = None) -> dict[str, str]:
        """An ``ExtenderBindingResult``: ``{"Error": ""}`` when bound, else the reason. The deadline
        (:attr:`bind_timeout_s`) counts from ``arrived`` (the event loop's time when the request came in; the routes
        pass it, so that reading the body and waiting for a turn count too), else from now.

        Idempotent per pod UID (:mod:`.bindings`): a repeat of a bind that succeeded succeeds again without charging
        the pod's GPUs a second time, one that arrives while the first is at the API server waits for its outcome
        (:meth:`_earlier_attempt`, :meth:`_already_bound`); else one attempt (:meth:`_attempt`) chooses the GPUs
        (:meth:`_choose_gpus`), sends the Binding (:meth:`_send_binding`) and records the placement (:meth:`_bound`).
        """
        loop = asyncio.get_running_loop()
        deadline = (loop.time() if arrived is None else arrived) + self.bind_timeout_s
        b = body if isinstance(body, wire.ExtenderBindingArgs) else wire.parse_binding(body)
        key = pod_key(b.PodNamespace, b.PodName)
        try:
            if not self.settings.bind_enabled:
                raise _BindFailed(
                    "binding through kelvin is disabled (KELVIN_BIND_ENABLED=false); "
                    "remove bindVerb from the scheduler's extender configuration"
                )
            if not b.PodUID:  # nothing to know the pod by across requests (kube-scheduler always sends it)
                return await self._attempt(b, key, deadline, None)
            earlier = await self._earlier_attempt(b.PodUID, key, deadline)
            if self._already_bound(b, key, earlier):
                self.metrics.decisions.labels("bind", "bound").inc()
                return {"Error": ""}
        except _BindFailed as exc:
            return self._bind_error(key, str(exc))
        return await self._recorded_attempt(b, key, deadline, earlier)

    async def _earlier_attempt(self, uid: str, key: str, deadline: float) -> BindRecord | None:
        """The record of the last bind of ``uid``, once it is settled (an attempt still at the API server is waited
        for, until the deadline)."""
        rec = self.binds.get(uid)
        while rec is not None and rec.state is BindState.PENDING:
            try:
                async with asyncio.timeout_at(deadline):
                    await rec.settled.wait()
            except TimeoutError:
                raise _BindFailed(f"an earlier bind of pod {key} is still in progress: {self._late()}") from None
            rec = self.binds.get(uid)
        return rec

    def _already_bound(self, b: wire.ExtenderBindingArgs, key: str, earlier: BindRecord | None) -> bool:
        """Whether the pod is bound to ``b.Node`` already: by an earlier attempt, or before kelvin restarted (or by an
        attempt it forgot) as the snapshot shows. Bound elsewhere: refused."""
        if earlier is not None and earlier.state is BindState.BOUND:
            if earlier.node != b.Node:
                raise _BindFailed(f"pod {key} (uid {b.PodUID}) is already bound to {earlier.node}, not {b.Node}")
            log.info("bind of %s to %s repeated: already bound (gpus %s)", key, b.Node, _gpus_text(earlier.gpus))
            return True
        if self._snapshot_shows(b.Node, b.PodUID):
            log.info("bind of %s to %s repeated: telemetry already shows it there", key, b.Node)
            return True
        return False

    async def _recorded_attempt(
        self, b: wire.ExtenderBindingArgs, key: str, deadline: float, earlier: BindRecord | None
    ) -> dict[str, str]:
        """An attempt with a record (:mod:`.bindings`) for its outcome. An earlier attempt on the same node that may
        have been applied is retried with the same GPUs rather than charging new ones."""
        uid = b.PodUID
        retry = earlier if earlier is not None and earlier.node == b.Node and earlier.assignment is not None else None
        new = self.binds.start(uid, b.Node)
        try:
            return await self._attempt(b, key, deadline, new, retry=retry)
        finally:
            if new.state is BindState.PENDING:  # cancelled (the client went away) or an unexpected failure
                self.binds.settle(uid, new, BindState.UNCERTAIN if new.assignment is not None else None)

    def _snapshot_shows(self, node: str, uid: str) -> bool:
        n = self.cache.snapshot.node(node)
        return n is not None and any(a.pod_uid == uid for a in n.assignments)

    async def _attempt(
        self,
        b: wire.ExtenderBindingArgs,
        key: str,
        deadline: float,
        rec: BindRecord | None,
        *,
        retry: BindRecord | None = None,
    ) -> dict[str, str]:
        """One bind attempt; ``rec`` (when the pod has a UID) is settled with its outcome. ``retry``: an earlier
        attempt on the same node whose outcome is unknown, whose GPUs (still assumed) are sent again."""
        try:
            gpus, assignment = await self._choose_gpus(b, key, deadline, retry)
            if rec is not None:
                rec.gpus, rec.assignment = gpus, assignment
            await self._send_binding(b, key, deadline, gpus, assignment)
        except _BindFailed as exc:
            if rec is not None:
                self.binds.settle(b.PodUID, rec, exc.state)
            return self._bind_error(key, str(exc))
        if rec is not None:
            self.binds.settle(b.PodUID, rec, BindState.BOUND)
        self._bound(b.Node, key, gpus, assignment)
        return {"Error": ""}

    async def _choose_gpus(
        self, b: wire.ExtenderBindingArgs, key: str, deadline: float, retry: BindRecord | None
    ) -> tuple[tuple[int, ...], GpuAssignment | None]:
        """The GPUs to bind the pod with, and their claim, assumed in the ledger (None: no GPUs): a retry's again, else
        picked now on ``b.Node`` for the pod's request."""
        if retry is not None:
            log.info("bind of %s to %s retried: sending the same gpus %s", key, b.Node, _gpus_text(retry.gpus))
            if retry.assignment is not None:  # still assumed, or again (the entry is the pod's: never counted twice)
                self.ledger.assume(b.Node, retry.assignment, self.clock())
            return retry.gpus, retry.assignment
        req = self.memo.get(b.PodUID, key)
        if req is None:
            req = await self._read_request(b, key, deadline)
        async with self.turn:  # picking is CPU work: in turn with the other verbs (see ``turn``)
            now = self.clock()
            gpus = self._pick(req, b.Node, key, b.PodUID, now)
            if not gpus:
                return gpus, None
            # Assume before the first await, so that a concurrent bind already sees these GPUs as taken.
            assignment = claim_of(req, gpus, pod_key=key, pod_uid=b.PodUID or None)  # charged by GPU size
            self.ledger.assume(b.Node, assignment, now)
            return gpus, assignment

    async def _read_request(self, b: wire.ExtenderBindingArgs, key: str, deadline: float) -> GpuRequest:
        """The pod's request, read from the API server (a pod kelvin has not seen in a filter call)."""
        try:
            with self.cache.gate.awaiting():
                async with asyncio.timeout_at(deadline):
                    pod = await self.binder.get_pod(b.PodNamespace, b.PodName)
        except BindError as exc:
            raise _BindFailed(str(exc)) from None
        except TimeoutError:
            raise _BindFailed(f"cannot read pod {key}: {self._late()}") from None
        if pod is None:
            raise _BindFailed(f"kelvin has not seen pod {key} in a filter call and cannot read it")
        try:
            return parse_pod(pod)
        except RequestError as exc:
            raise _BindFailed(f"pod {key}: {exc}") from None

    def _pick(self, req: GpuRequest, node: str, key: str, uid: str, now: float) -> tuple[int, ...]:
        """The GPUs of ``node`` for ``req``: the gang's plan, else the framework's pick; refused when it no longer
        fits (with the filters' reasons)."""
        if not req.wants_gpu:
            return ()
        snap = self.cache.snapshot
        fleet = snap.arrays
        row = fleet.index.get(node)
        if row is None:
            raise _BindFailed(f"node {node}: {UNKNOWN_NODE_REASON}")
        ctx = self.framework.context(fleet, now)
        gpus = self._planned(snap, node, key, uid, now) or self.framework.pick(req, fleet, row, ctx)
        if gpus is None:
            why = self.framework.explain(req, fleet, row, ctx)
            reasons = "; ".join(v.reason for v in why.filters if v.reason) or "no GPUs left"
            raise _BindFailed(f"pod {key} no longer fits node {node}: {reasons}")
        return gpus

    def _planned(self, snap: Snapshot, node: str, key: str, uid: str, now: float) -> tuple[int, ...] | None:
        """A gang member's planned GPUs on ``node``: held in the snapshot, else the plan filter read from the pod
        while the pod listing does not show it yet (refused when another pod took them meanwhile); ``None`` for a pod
        without a plan there."""
        held = gangs.planned_gpus(snap, node, key)
        if held:
            return held
        plan = self.plans.get(uid, key)
        if plan is None or plan.node != node or not plan.gpus:
            return None
        problem = gangs.bind_problem(plan, snap, self.ledger.entries(now).get(node, ()))
        if problem is not None:
            raise _BindFailed(f"pod {key} (gang member): {problem}; the operator re-plans the gang")
        return plan.gpus

    async def _send_binding(
        self,
        b: wire.ExtenderBindingArgs,
        key: str,
        deadline: float,
        gpus: tuple[int, ...],
        assignment: GpuAssignment | None,
    ) -> None:
        """Create the Binding. A refusal releases the assumed GPUs; a failure that may have been applied (no answer, a
        5xx, the deadline) keeps them assumed until the pod list or the ledger's TTL shows the truth."""
        try:
            with self.cache.gate.awaiting():  # no CPU used meanwhile: the refresh need not wait for the API server
                async with asyncio.timeout_at(deadline):
                    await self.binder.bind(b.PodNamespace, b.PodName, b.PodUID, b.Node, gpus)
        except BindError as exc:
            if assignment is None:
                raise _BindFailed(str(exc)) from None
            if bind_refused(exc):
                self.ledger.forget(key, assignment)
                raise _BindFailed(str(exc)) from None
            log.info("bind of %s may have been applied (%s): its GPUs stay assumed", key, exc)
            raise _BindFailed(str(exc), BindState.UNCERTAIN) from None
        except TimeoutError:
            raise _BindFailed(f"binding pod {key} to {b.Node}: {self._late()}", BindState.UNCERTAIN) from None

    def _bound(self, node: str, key: str, gpus: tuple[int, ...], assignment: GpuAssignment | None) -> None:
        """A Binding created: shown to a source that must learn of binds, counted and logged."""
        if assignment is not None and isinstance(self.source, BindingObserver):
            try:
                self.source.record_binding(node, assignment)
            except KeyError as exc:
                log.warning("the source does not know node %s: %s", node, exc)
        self.metrics.decisions.labels("bind", "bound").inc()
        log.info("bound %s to %s gpus %s", key, node, _gpus_text(gpus))

    def _late(self) -> str:
        return (
            f"the Kubernetes API server did not answer within {self.bind_timeout_s:g} s (kelvin's bind deadline, "
            "kept below kube-scheduler's extender httpTimeout)"
        )

    def _bind_error(self, key: str, message: str) -> dict[str, str]:
        log.warning("bind of %s failed: %s", key, message)
        self.metrics.decisions.labels("bind", "error").inc()
        return {"Error": message}

    # -- explain -----------------------------------------------------------------------------------------------

    def explain(self, pod: dict[str, Any], node: str, candidates: list[str] | None = None) -> dict[str, Any]:
        """Each filter's verdict and each policy's score and reasons for ``pod`` on ``node``.
        Raises :class:`~.errors.WireError` for an unreadable pod or an unknown node."""
        try:
            req = parse_pod(pod)
        except RequestError as exc:
            raise WireError(f"pod: {exc}") from None
        fleet = self.cache.snapshot.arrays
        row = fleet.index.get(node)
        if row is None:
            raise WireError(f"node: {node!r} is not in kelvin's snapshot ({fleet.n_nodes} nodes)")
        if candidates is None:
            cand = np.arange(fleet.n_nodes, dtype=np.int64)
        else:
            rows = wire.NodeNameList(candidates).rows(fleet.index)
            cand = rows[rows >= 0]
        ctx = self.framework.context(fleet, self.clock())
        out = self.framework.explain(req, fleet, row, ctx, candidates=cand).to_dict()
        labels = self.node_labels.labels() if self.node_labels is not None else None
        gang = explain_gang(pod, req, node, self.policy.gang, self.gang_planner, self.cache.snapshot, ctx, labels)
        if gang is not None:
            out["gang"] = gang
        out["snapshot_age_s"] = round(self.cache.snapshot.age_seconds(self.clock()), 3)
        return out
