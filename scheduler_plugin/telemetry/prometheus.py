"""PrometheusSource: GPU telemetry from Prometheus, with kelvin exporter or NVIDIA dcgm-exporter metric names.

Each refresh runs one PromQL instant query per signal, each covering every node at once, concurrently. Per-node
freshness comes from the samples' own timestamps (``timestamp(...)``), not from the query time; a node whose series
vanish (exporter down: Prometheus marks them stale) keeps its last telemetry with its old ``observed_at``, so the
cache marks that node stale instead of forgetting it, for ``forget_after_s``.

dcgm-exporter lacks some signals by default (thresholds, max SM clock, topology): those come from the GPU
catalogue (:mod:`~scheduler_plugin.model.catalogue`) per GPU model, overridable in config. The snapshot cache that
calls :meth:`fetch` reports the refreshes, their duration and fresh/stale nodes as
``kelvin_telemetry_*{source="prometheus"}``. See docs/telemetry-sources.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import httpx
import orjson

from ..model import MIB, GpuInfo, GpuNode, GpuProcess
from ..model.catalogue import GpuModelSpec, defaults_for
from ..model.node_topology import nvlink_peers, pcie_switches
from .prom_vector import Sample, decode_vector
from .sanity import (
    ANY,
    BITMASK,
    BYTES,
    CELSIUS,
    COUNT,
    HERTZ,
    LEVEL,
    MEBIBYTES,
    MEGAHERTZ,
    NUMA,
    PERCENT,
    RATIO,
    UNIX_TIME,
    WATTS,
    Range,
    SampleIssues,
)
from .source import SourceError, remember_nodes

log = logging.getLogger(__name__)

MetricsFlavour = Literal["auto", "kelvin", "dcgm"]

#: Labels that name the node on dcgm-exporter series, in order of preference.
DCGM_NODE_LABELS = ("Hostname", "hostname", "node", "kubernetes_node")


def _per_gpu(metric: str) -> str:
    """One series per GPU with only ``node`` and ``gpu`` kept: half the JSON, and duplicates (two Prometheus jobs
    scraping one exporter) collapse."""
    return f"max by (node, gpu) ({metric})"


#: The GPU set and its identity (``uuid``, ``model``) come from ``total``; every other signal is keyed by node + gpu.
KELVIN_QUERIES: dict[str, str] = {
    "total": "max by (node, gpu, uuid, model) (kelvin_gpu_memory_total_bytes)",
    "used": _per_gpu("kelvin_gpu_memory_used_bytes"),
    # freshness is per node: the newest sample time of the node's GPUs
    "seen": "max by (node) (timestamp(kelvin_gpu_memory_used_bytes))",
    "temp": _per_gpu("kelvin_gpu_temperature_celsius"),
    "mem_temp": _per_gpu("kelvin_gpu_memory_temperature_celsius"),
    "slowdown": _per_gpu("kelvin_gpu_slowdown_temperature_celsius"),
    "shutdown": _per_gpu("kelvin_gpu_shutdown_temperature_celsius"),
    # sparse: only GPUs with a reason set come back (absent = no reason)
    "reasons": _per_gpu("kelvin_gpu_clocks_event_reasons") + " > 0",
    "clock": _per_gpu("kelvin_gpu_sm_clock_hertz"),
    "clock_max": _per_gpu("kelvin_gpu_sm_clock_max_hertz"),
    "util": _per_gpu("kelvin_gpu_utilization_ratio"),
    "mem_util": _per_gpu("kelvin_gpu_memory_utilization_ratio"),
    "power": _per_gpu("kelvin_gpu_power_watts"),
    "numa": _per_gpu("kelvin_gpu_numa_node"),
    "xid": "sum by (node, gpu) (increase(kelvin_gpu_xid_errors_total[{xid_window}])) > 0",
    # one series per (GPU, peer) instead of one per link; only same-switch pairs matter for PCIe grouping
    "nvlink": "max by (node, gpu, peer_gpu) (kelvin_gpu_nvlink_link_up) == 1",
    "topology": "max by (node, gpu, peer_gpu) (kelvin_gpu_topology_level) <= 20",
    "procs": "max by (node, gpu, pid, pod_uid, namespace, pod) (kelvin_gpu_process_memory_used_bytes)",
}

DCGM_QUERIES: dict[str, str] = {
    "fb_used": "DCGM_FI_DEV_FB_USED",
    "fb_free": "DCGM_FI_DEV_FB_FREE",
    "fb_reserved": "DCGM_FI_DEV_FB_RESERVED",
    "seen": "timestamp(DCGM_FI_DEV_FB_USED)",
    "temp": "DCGM_FI_DEV_GPU_TEMP",
    "mem_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "slowdown": "DCGM_FI_DEV_SLOWDOWN_TEMP",
    "shutdown": "DCGM_FI_DEV_SHUTDOWN_TEMP",
    "reasons": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "clock": "DCGM_FI_DEV_SM_CLOCK",
    "clock_max": "DCGM_FI_DEV_MAX_SM_CLOCK",
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "mem_util": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "power": "DCGM_FI_DEV_POWER_USAGE",
    "xid": "DCGM_EXP_XID_ERRORS_COUNT",
}

#: Plausible values of each signal (a sample outside is dropped and reported, see :mod:`.sanity`).
KELVIN_RANGES: dict[str, Range] = {
    "total": BYTES,
    "used": BYTES,
    "seen": UNIX_TIME,
    "temp": CELSIUS,
    "mem_temp": CELSIUS,
    "slowdown": CELSIUS,
    "shutdown": CELSIUS,
    "reasons": BITMASK,
    "clock": HERTZ,
    "clock_max": HERTZ,
    "util": RATIO,
    "mem_util": RATIO,
    "power": WATTS,
    "numa": NUMA,
    "xid": COUNT,
    "nvlink": ANY,
    "topology": LEVEL,
    "procs": BYTES,
}
DCGM_RANGES: dict[str, Range] = {
    "fb_used": MEBIBYTES,
    "fb_free": MEBIBYTES,
    "fb_reserved": MEBIBYTES,
    "seen": UNIX_TIME,
    "temp": CELSIUS,
    "mem_temp": CELSIUS,
    "slowdown": CELSIUS,
    "shutdown": CELSIUS,
    "reasons": BITMASK,
    "clock": MEGAHERTZ,
    "clock_max": MEGAHERTZ,
    "util": PERCENT,
    "mem_util": PERCENT,
    "power": WATTS,
    "xid": COUNT,
}

GpuKey = tuple[str, str]

#: Signals that change only with the hardware or the driver: read every ``static_every`` refreshes, and at once when
#: a GPU appears that the cache lacks.
KELVIN_STATIC = ("total", "slowdown", "shutdown", "clock_max", "numa", "nvlink", "topology")


@dataclass
class _Gpu:
    """One GPU's values, gathered from the per-signal answers."""

    index: int
    uuid: str = ""
    model: str = ""
    values: dict[str, float] = field(default_factory=dict)
    nvlink_peers: set[int] = field(default_factory=set)
    on_nvswitch: bool = False
    topology: dict[int, float] = field(default_factory=dict)
    processes: list[GpuProcess] = field(default_factory=list)
    xid: float = 0.0


def _is_index(text: str) -> bool:
    """An ASCII decimal number (``str.isdigit`` also accepts ``'٥'`` and ``'²'``, which ``int`` reads or refuses)."""
    return text.isascii() and text.isdigit()


class PrometheusSource:
    """A :class:`~.source.TelemetrySource` over the Prometheus HTTP API (``/api/v1/query``)."""

    name = "prometheus"

    def __init__(  # noqa: PLR0913
        self,
        url: str,
        *,
        metrics: MetricsFlavour = "auto",
        timeout_s: float = 5.0,
        forget_after_s: float = 3600.0,
        xid_window: str = "10m",
        model_overrides: Mapping[str, GpuModelSpec] | None = None,
        node_labels: Sequence[str] = DCGM_NODE_LABELS,
        max_concurrency: int = 4,
        static_every: int = 12,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self.metrics = metrics
        self.forget_after_s = forget_after_s
        self.xid_window = xid_window
        self.model_overrides = dict(model_overrides or {})
        self.node_labels = tuple(node_labels)
        self._clock = clock
        self.timeout_s = timeout_s
        """Longest one query may take, all of it (connect, send, the whole answer), not only each read."""
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, transport=transport)
        self.issues = SampleIssues(log)
        """Samples dropped (implausible values, labels that are not strings) or corrected (future timestamps)."""
        self._dropped: set[str] = set()
        """Queries of this refresh that had samples dropped."""
        self._static_dirty = False
        """The static signals last read had samples dropped: read them again next refresh (not in 12)."""
        self._known: dict[str, GpuNode] = {}
        self.static_every = max(1, static_every)
        self._static: dict[GpuKey, _Gpu] | None = None
        self._refreshes = 0
        self._no_temperature: set[GpuKey] = set()
        self._no_total: set[GpuKey] = set()
        """GPUs seen without a memory-total series (warned once each; they do not trigger static re-reads)."""
        """GPUs already reported as missing a temperature series (warned once each)."""
        # a few queries at a time: Prometheus runs at most --query.max-concurrency (20) for everyone
        self._slots = asyncio.Semaphore(max_concurrency)

    async def close(self) -> None:
        await self._http.aclose()

    @property
    def bad_samples(self) -> Mapping[str, int]:
        return self.issues.counts

    async def fetch(self) -> Sequence[GpuNode]:
        self._dropped.clear()
        nodes: dict[str, GpuNode] = {}
        if self.metrics in ("auto", "kelvin"):
            nodes.update(await self._fetch_kelvin())
        if self.metrics in ("auto", "dcgm"):
            for name, node in (await self._fetch_dcgm()).items():
                nodes.setdefault(name, node)  # a node with both exporters: kelvin's richer view wins
        return self._remember(nodes)

    def _remember(self, fresh: dict[str, GpuNode]) -> list[GpuNode]:
        """Nodes seen now, plus nodes seen before whose series vanished, kept with their old ``observed_at``."""
        return remember_nodes(
            self._known, fresh, self._clock(), self.forget_after_s, issues=self.issues, source="prometheus"
        )

    # ----------------------------------------------------------------------------------------------------- HTTP
    async def _query(self, query: str, rng: Range) -> list[Sample]:
        try:
            async with self._slots, asyncio.timeout(self.timeout_s):
                resp = await self._http.get("/api/v1/query", params={"query": query})
        except httpx.HTTPError as exc:
            raise SourceError(f"prometheus at {self.url} unreachable: {exc!r}") from exc
        except TimeoutError:  # a server that trickles its answer never trips httpx's per-read timeout
            raise SourceError(
                f"prometheus at {self.url}: query {query!r} did not finish within {self.timeout_s:g} s "
                "(prometheus_timeout_s)"
            ) from None
        before = self.issues.total
        try:
            samples = decode_vector(resp.content, query, rng, self.issues)
        except orjson.JSONDecodeError:
            raise SourceError(
                f"prometheus at {self.url} answered HTTP {resp.status_code} with non-JSON: {resp.text[:200]!r}"
            ) from None
        log.debug("prometheus query %s: HTTP %d, %d samples", query, resp.status_code, len(samples))
        if self.issues.total > before:
            self._dropped.add(query)
        return samples

    async def _query_all(self, queries: Mapping[str, str], ranges: Mapping[str, Range]) -> dict[str, list[Sample]]:
        keys = list(queries)
        answers = await asyncio.gather(*(self._query(queries[k], ranges[k]) for k in keys))
        return dict(zip(keys, answers, strict=True))

    # --------------------------------------------------------------------------------------------------- kelvin
    async def _fetch_kelvin(self) -> dict[str, GpuNode]:
        queries = {k: q.replace("{xid_window}", self.xid_window) for k, q in KELVIN_QUERIES.items()}
        dynamic = {k: q for k, q in queries.items() if k not in KELVIN_STATIC}
        static_due = self._static is None or self._static_dirty or self._refreshes % self.static_every == 0
        self._refreshes += 1
        answers = await self._query_all(queries if static_due else dynamic, KELVIN_RANGES)
        unknown = {k for labels, _ in answers["used"] if (k := _kelvin_key(labels)) is not None} - set(
            self._static or {}
        )
        if static_due or unknown - self._no_total:
            if not static_due:  # a GPU the cache has not seen: read the static signals now
                answers.update(await self._query_all({k: queries[k] for k in KELVIN_STATIC}, KELVIN_RANGES))
            self._static = _kelvin_static(answers)
            self._static_dirty = any(queries[k] in self._dropped for k in KELVIN_STATIC)
            # GPUs with a used-memory series but no total one cannot be sized: left out, warned once, and not a
            # reason to re-read the static signals on every refresh (only when they are due again).
            missing = unknown - set(self._static)
            for node, index in sorted(missing - self._no_total):
                log.warning(
                    "node %s GPU %s: kelvin_gpu_memory_total_bytes is missing in Prometheus; the GPU is left out of "
                    "the snapshot until it appears (a relabelling or recording rule dropping it?)",
                    node,
                    index,
                )
            self._no_total = missing
        static = self._static or {}
        gpus: dict[GpuKey, _Gpu] = {}
        for labels, value in answers["used"]:
            key = _kelvin_key(labels)
            template = static.get(key) if key is not None else None
            if key is not None and template is not None:
                gpu = gpus[key] = _Gpu(
                    template.index,
                    template.uuid,
                    template.model,
                    dict(template.values),
                    template.nvlink_peers,
                    template.on_nvswitch,
                    template.topology,
                )
                gpu.values["used"] = value
        node_seen = {labels.get("node"): value for labels, value in answers["seen"]}
        for key, gpu in gpus.items():
            if key[0] in node_seen:
                gpu.values["seen"] = node_seen[key[0]]
        _assign(
            gpus, answers, ("temp", "mem_temp", "reasons", "clock", "util", "mem_util", "power", "xid"), _kelvin_key
        )
        for labels, value in answers["procs"]:
            found = gpus.get(_kelvin_key(labels))  # type: ignore[arg-type]
            if found is not None and _is_index(labels.get("pid", "")):
                found.processes.append(
                    GpuProcess(
                        pid=int(labels["pid"]),
                        used_bytes=int(value),
                        pod_uid=labels.get("pod_uid") or None,
                        pod_namespace=labels.get("namespace") or None,
                        pod_name=labels.get("pod") or None,
                    )
                )
        return self._build(gpus, clock_scale=1e-6, dcgm=False)

    # ----------------------------------------------------------------------------------------------------- dcgm
    async def _fetch_dcgm(self) -> dict[str, GpuNode]:
        answers = await self._query_all(DCGM_QUERIES, DCGM_RANGES)
        gpus: dict[GpuKey, _Gpu] = {}
        for labels, value in answers["fb_used"]:
            key = self._dcgm_key(labels)
            if key is None:
                continue
            gpu = gpus.setdefault(key, _Gpu(int(key[1])))
            gpu.uuid, gpu.model = labels.get("UUID", ""), labels.get("modelName", "")
            gpu.values["fb_used"] = value
            pod = labels.get("pod") or labels.get("pod_name")
            if pod:
                namespace = labels.get("namespace") or labels.get("pod_namespace") or None
                # dcgm-exporter attributes a whole GPU to the pod it is allocated to, not a process: pid 0. The same
                # series scraped by two jobs (differing only in instance/job) is one pod, not two.
                if not any(p.pod_name == pod and p.pod_namespace == namespace for p in gpu.processes):
                    gpu.processes.append(
                        GpuProcess(pid=0, used_bytes=int(value * MIB), pod_namespace=namespace, pod_name=pod)
                    )
        _assign(
            gpus,
            answers,
            (
                "fb_free",
                "fb_reserved",
                "seen",
                "temp",
                "mem_temp",
                "slowdown",
                "shutdown",
                "reasons",
                "clock",
                "clock_max",
                "util",
                "mem_util",
                "power",
            ),
            self._dcgm_key,
        )
        # One count per GPU and XID code: duplicate series (two scrape jobs on one exporter) are the same count.
        xids: dict[tuple[GpuKey, str], float] = {}
        for labels, value in answers["xid"]:
            key = self._dcgm_key(labels)
            if key is not None and key in gpus:
                code = labels.get("xid") or labels.get("err_code") or ""
                xids[(key, code)] = max(value, xids.get((key, code), 0.0))
        for (key, _), value in xids.items():
            gpus[key].xid += value
        for gpu in gpus.values():
            v = gpu.values
            used_mib = v["fb_used"] + v.get("fb_reserved", 0.0)
            if "fb_free" in v:
                v["total"] = (used_mib + v["fb_free"]) * MIB
            v["used"] = used_mib * MIB
            v["xid"] = gpu.xid
            for signal in ("util", "mem_util"):
                if signal in v:
                    v[signal] /= 100.0
        return self._build(gpus, clock_scale=1.0, dcgm=True)

    def _dcgm_key(self, labels: Mapping[str, str]) -> GpuKey | None:
        node = next((labels[n] for n in self.node_labels if labels.get(n)), None)
        gpu = labels.get("gpu", "")
        return (node, gpu) if node and _is_index(gpu) else None

    # ---------------------------------------------------------------------------------------------------- build
    def _build(self, gpus: Mapping[GpuKey, _Gpu], *, clock_scale: float, dcgm: bool) -> dict[str, GpuNode]:
        by_node: dict[str, list[_Gpu]] = {}
        for (node, _), gpu in gpus.items():
            by_node.setdefault(node, []).append(gpu)
        out: dict[str, GpuNode] = {}
        for node, members in by_node.items():
            members.sort(key=lambda g: g.index)
            switches = pcie_switches({g.index: g.topology for g in members})
            links = nvlink_peers(
                {g.index: g.nvlink_peers for g in members}, {g.index for g in members if g.on_nvswitch}
            )
            infos = []
            seen: list[float] = []
            for g in members:
                d = defaults_for(g.model, self.model_overrides)
                v = g.values
                if "temp" not in v and (node, str(g.index)) not in self._no_temperature:
                    self._no_temperature.add((node, str(g.index)))
                    log.warning(
                        "node %s GPU %d: no temperature series in Prometheus (%s); its temperature is unknown and "
                        "scores as no thermal headroom",
                        node,
                        g.index,
                        "DCGM_FI_DEV_GPU_TEMP" if dcgm else "kelvin_gpu_temperature_celsius",
                    )
                if "seen" in v:
                    seen.append(v["seen"])
                peers = set(links[g.index])
                if dcgm and d.nvswitch and not g.on_nvswitch:
                    # dcgm-exporter has no link metrics; an HGX board's GPUs all share the NVSwitch fabric
                    peers |= {m.index for m in members} - {g.index}
                clock_max = v.get("clock_max")
                infos.append(
                    GpuInfo(
                        index=g.index,
                        uuid=g.uuid,
                        model=g.model,
                        memory_total_bytes=int(v.get("total", d.memory_total_bytes)),
                        memory_used_bytes=int(v.get("used", 0.0)),
                        temperature_celsius=v.get("temp", math.nan),
                        memory_temperature_celsius=v.get("mem_temp"),
                        slowdown_celsius=v.get("slowdown", d.slowdown_celsius),
                        shutdown_celsius=v.get("shutdown", d.shutdown_celsius),
                        throttle_reasons=int(v.get("reasons", 0.0)),
                        sm_clock_mhz=v.get("clock", 0.0) * clock_scale,
                        sm_clock_max_mhz=clock_max * clock_scale if clock_max is not None else d.sm_clock_max_mhz,
                        utilization=v.get("util", 0.0),
                        memory_utilization=v.get("mem_util", 0.0),
                        power_watts=v.get("power"),
                        xid_errors=min(round(v.get("xid", 0.0)), int(COUNT.hi)),  # summed over XID codes
                        numa_node=int(v.get("numa", 0.0)),
                        pcie_switch=switches[g.index],
                        nvlink_peers=frozenset(peers),
                        processes=tuple(sorted(g.processes, key=lambda p: p.pid)),
                    )
                )
            out[node] = GpuNode(name=node, gpus=tuple(infos), observed_at=max(seen) if seen else None)
        return out


def _assign(
    gpus: Mapping[GpuKey, _Gpu],
    answers: Mapping[str, list[Sample]],
    signals: Iterable[str],
    key_of: Callable[[Mapping[str, str]], GpuKey | None],
) -> None:
    """Each sample of each signal onto its GPU's values (samples of GPUs not in ``gpus`` are ignored)."""
    for signal in signals:
        for labels, value in answers[signal]:
            key = key_of(labels)
            if key is not None and key in gpus:
                gpus[key].values[signal] = value


def _kelvin_key(labels: Mapping[str, str]) -> GpuKey | None:
    node, gpu = labels.get("node"), labels.get("gpu")
    return (node, gpu) if node and gpu else None


def _kelvin_static(answers: Mapping[str, list[Sample]]) -> dict[GpuKey, _Gpu]:
    """The per-GPU templates built from the static signals (identity, thresholds, max clock, NUMA, links)."""
    gpus: dict[GpuKey, _Gpu] = {}
    for labels, value in answers["total"]:
        key = _kelvin_key(labels)
        if key is not None and _is_index(key[1]):
            gpus[key] = _Gpu(int(key[1]), labels.get("uuid", ""), labels.get("model", ""), {"total": value})
    _assign(gpus, answers, ("slowdown", "shutdown", "clock_max", "numa"), _kelvin_key)
    for labels, _ in answers["nvlink"]:
        found = gpus.get(_kelvin_key(labels))  # type: ignore[arg-type]
        peer = labels.get("peer_gpu", "")
        if found is not None and _is_index(peer):
            found.nvlink_peers.add(int(peer))
        elif found is not None and peer == "nvswitch":
            found.on_nvswitch = True
    for labels, value in answers["topology"]:
        found = gpus.get(_kelvin_key(labels))  # type: ignore[arg-type]
        if found is not None and _is_index(labels.get("peer_gpu", "")):
            found.topology[int(labels["peer_gpu"])] = value
    return gpus
