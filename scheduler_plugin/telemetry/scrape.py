"""ScrapeSource: GPU telemetry straight from the kelvin exporters, for clusters without Prometheus.

Each refresh lists the EndpointSlices of the exporter's Service, then GETs every exporter's ``/v1/node`` (the node in
the shared model, as JSON) concurrently, each with a timeout. An exporter that does not answer leaves its node with
its last telemetry and old ``observed_at`` (so the cache marks that node stale); only a failed EndpointSlice list
fails the whole refresh. The timeout bounds each exporter's whole answer (an exporter trickling its answer is cut
off like a silent one). A GPU whose numbers are implausible (:mod:`.sanity`: a memory total beyond 2^53 bytes, a
temperature outside -50..200 °C) is left out of its node and reported; an ``observed_at`` in the future is clamped.
The snapshot cache reports refreshes and fresh/stale nodes as ``kelvin_telemetry_*{source="scrape"}``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from ..kubeapi import KubeClient, KubeError
from ..model import GpuNode
from ..model.serde import GPU_ERRORS_HEADER, ModelJSONError, node_from_json
from .sanity import MAX_BYTES, SampleIssues, implausible_gpu
from .source import SourceError, remember_nodes

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Target:
    """One exporter pod: where to reach it, and the node it runs on (from the EndpointSlice)."""

    url: str
    node: str | None


def targets_from_slices(slices: Mapping[str, Any], default_port: int, port_name: str = "metrics") -> list[Target]:
    """Exporter targets in an EndpointSliceList: every address of every endpoint that is not terminating.

    The port is the slice's port named ``port_name``, else its only port, else ``default_port``.
    """
    out: list[Target] = []
    for item in slices.get("items") or ():
        ports = [p for p in item.get("ports") or () if p.get("port")]
        named = [p for p in ports if p.get("name") == port_name]
        port = int((named or ports)[0]["port"]) if (named or len(ports) == 1) else default_port
        for ep in item.get("endpoints") or ():
            if (ep.get("conditions") or {}).get("terminating"):
                continue
            for address in ep.get("addresses") or ():
                host = f"[{address}]" if ":" in address else address
                out.append(Target(f"http://{host}:{port}", ep.get("nodeName")))
    return out


class ScrapeSource:
    """A :class:`~.source.TelemetrySource` over the exporters' ``/v1/node``."""

    name = "scrape"

    def __init__(
        self,
        kube: KubeClient,
        *,
        service: str = "kelvin-exporter",
        namespace: str = "kelvin-system",
        port: int = 9400,
        timeout_s: float = 5.0,
        forget_after_s: float = 3600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.service = service
        self.namespace = namespace
        self.port = port
        self.forget_after_s = forget_after_s
        self._clock = clock
        self.timeout_s = timeout_s
        """Longest an exporter's whole answer may take (httpx's own timeout bounds each read only)."""
        self._http = httpx.AsyncClient(timeout=timeout_s, transport=transport)
        self.issues = SampleIssues(log)
        self._known: dict[str, GpuNode] = {}
        self.failed_targets: list[str] = []
        """Exporters that did not answer in the last refresh (``url: reason``)."""

    async def close(self) -> None:
        await self._http.aclose()
        await self.kube.close()

    @property
    def bad_samples(self) -> Mapping[str, int]:
        return self.issues.counts

    async def targets(self) -> list[Target]:
        path = f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
        try:
            slices = await self.kube.get(path, params={"labelSelector": f"kubernetes.io/service-name={self.service}"})
        except KubeError as exc:
            raise SourceError(
                f"cannot list the EndpointSlices of service {self.namespace}/{self.service}: {exc}"
            ) from exc
        return targets_from_slices(slices, self.port)

    async def fetch(self) -> Sequence[GpuNode]:
        targets = await self.targets()
        answers = await asyncio.gather(*(self._scrape(t) for t in targets))
        fresh: dict[str, GpuNode] = {}
        self.failed_targets = []
        for target, answer in zip(targets, answers, strict=True):
            if isinstance(answer, GpuNode):
                fresh[answer.name] = answer
            else:
                self.failed_targets.append(f"{target.url}: {answer}")
        if self.failed_targets:
            log.warning("%d exporter(s) did not answer: %s", len(self.failed_targets), "; ".join(self.failed_targets))
        return remember_nodes(
            self._known, fresh, self._clock(), self.forget_after_s, issues=self.issues, source="scrape"
        )

    async def _scrape(self, target: Target) -> GpuNode | str:
        try:
            async with asyncio.timeout(self.timeout_s):
                resp = await self._http.get(f"{target.url}/v1/node")
        except httpx.HTTPError as exc:
            return f"unreachable ({exc!r})"
        except TimeoutError:
            return f"no whole answer within {self.timeout_s:g} s"
        if resp.status_code != 200:
            return f"HTTP {resp.status_code}: {resp.text[:200]}"
        try:
            node = node_from_json(resp.content)
        except ModelJSONError as exc:
            return str(exc)
        missing = resp.headers.get(GPU_ERRORS_HEADER)
        if missing:
            log.warning("exporter %s (node %s) could not read some GPUs, left out: %s", target.url, node.name, missing)
        return self._plausible(target, node)

    def _plausible(self, target: Target, node: GpuNode) -> GpuNode | str:
        """``node`` without its implausible GPUs (each reported), or why the whole answer is refused."""
        for field in (
            "cpu_allocatable_milli",
            "memory_allocatable_bytes",
            "cpu_requested_milli",
            "memory_requested_bytes",
        ):
            value = getattr(node, field)
            if not 0 <= value <= MAX_BYTES:
                self.issues.report(
                    "out_of_range",
                    f"{target.url}:{field}",
                    f"exporter {target.url} (node {node.name}): "
                    f"{field} {value!r} is outside 0..{MAX_BYTES}; answer dropped",
                )
                return f"implausible {field} {value!r}"
        kept = []
        for gpu in node.gpus:
            why = implausible_gpu(gpu)
            if why is None:
                kept.append(gpu)
            else:
                self.issues.report(
                    "out_of_range",
                    f"{target.url}:gpu",
                    f"exporter {target.url} (node {node.name}) GPU {gpu.index}: {why}; the GPU is left out",
                )
        return node if len(kept) == len(node.gpus) else replace(node, gpus=tuple(kept))
