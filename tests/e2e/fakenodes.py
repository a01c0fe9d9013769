"""Fake GPU nodes: the API side of a kubelet, for many nodes, without containers.

For each node: the Node object with capacity (``nvidia.com/gpu``, cpu, memory, pods; ``kelvin.dev/shared-gpu`` slots
on the nodes given ``--shared-gpu-slots``, as kelvin's device plugin advertises them) and a Ready condition, and a
Lease in ``kube-node-lease`` renewed every few seconds (kube-controller-manager's node lifecycle controller marks a
node unreachable and taints it when the lease lapses, as for a real node). For each pod bound to one of them: the
status a kubelet reports once its containers run (phase Running, Ready, container states). A pod being deleted
gracefully (``deletionTimestamp`` set, e.g. by an eviction) is deleted for good with ``gracePeriodSeconds: 0`` and
its UID as precondition, as a kubelet does once the containers stopped: evictions and PodDisruptionBudgets behave as
on a real cluster.

Run as its own process (one per cluster):

    python -m tests.e2e.fakenodes --server https://127.0.0.1:PORT --ca ca.crt --cert admin.crt --key admin.key \
        --nodes e2e-nvs-1,e2e-nvs-2,e2e-pcie-1 --gpus 8 [--shared-gpu-slots e2e-nvs-2=128]

It prints ``ready`` on stdout once every Node and Lease exists and every node is Ready. Pods get the node's address
(127.0.0.1, a loopback node) as their IP: nothing can reach them, and the endpoint controllers leave them out of
Services (loopback addresses are refused there), so an admission webhook whose Service points at such a pod fails
fast instead of timing out.
"""

from __future__ import annotations

import argparse
import datetime
import signal
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson

LEASE_DURATION_S = 40
RENEW_INTERVAL_S = 10.0
# requests in flight for registration and lease renewals: one at a time, 1,000 nodes took longer than a lease lasts
IN_FLIGHT = 8
NODE_ADDRESS = "127.0.0.1"
SHARED_GPU_RESOURCE = "kelvin.dev/shared-gpu"


def now_rfc3339(micro: bool = False) -> str:
    t = datetime.datetime.now(datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if micro else t.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_object(
    name: str, gpus: int, labels: dict[str, str], taints: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kelvin.dev/e2e-fake-node": "true",
                **labels,
            },
        },
        "spec": {"taints": taints} if taints else {},
    }


def node_status(gpus: int, version: str, shared_slots: int = 0) -> dict[str, Any]:
    """``shared_slots``: ``kelvin.dev/shared-gpu`` devices of the node (``kelvin device-plugin`` advertises GPUs x
    ``--shared-slots-per-gpu``); 0: none, the resource absent as on a node without kelvin's device plugin."""
    now = now_rfc3339()
    resources = {"cpu": "128", "memory": "2Ti", "pods": "110", "ephemeral-storage": "1Ti", "nvidia.com/gpu": str(gpus)}
    if shared_slots:
        resources[SHARED_GPU_RESOURCE] = str(shared_slots)

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "fake node"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "fake node"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "fake node"),
            condition("Ready", "True", "KubeletReady", "fake node (tests/e2e/fakenodes.py)"),
        ],
        "addresses": [{"type": "InternalIP", "address": NODE_ADDRESS}],
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "kelvin e2e fake node",
            "containerRuntimeVersion": "fake://0",
            "kubeletVersion": version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def running_status(pod: dict[str, Any]) -> dict[str, Any]:
    """What a kubelet reports for a pod whose containers all started and are ready."""
    now = now_rfc3339()
    spec = pod["spec"]

    def running(c: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }

    def completed(c: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": True,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}},
        }

    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": NODE_ADDRESS,
        "hostIPs": [{"ip": NODE_ADDRESS}],
        "podIP": NODE_ADDRESS,
        "podIPs": [{"ip": NODE_ADDRESS}],
        "startTime": now,
        "containerStatuses": [running(c) for c in spec.get("containers", [])],
    }
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [completed(c) for c in spec["initContainers"]]
    return status


class Agent:
    def __init__(
        self,
        client: httpx.Client,
        names: list[str],
        gpus: int,
        version: str,
        taints: dict[str, list[dict[str, str]]] | None = None,
        shared_slots: dict[str, int] | None = None,
    ) -> None:
        self.taints = taints or {}
        self.shared_slots = shared_slots or {}
        self.client = client
        self.names = names
        self.node_set = set(names)
        self.gpus = gpus
        self.version = version
        self.stopping = threading.Event()
        # two pools: renewals queued behind a long registration would let the first nodes' Leases lapse
        self.pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="register")
        self.lease_pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="leases")
        # the nodes whose Lease exists: the heartbeat renews them while the others are still being registered
        self.registered: list[str] = []
        self.registered_lock = threading.Lock()

    # ---- nodes ---------------------------------------------------------------------------------------------------
    def register(self) -> None:
        """Every node and its Lease, ``IN_FLIGHT`` at a time; the first error is raised."""
        for _ in self.pool.map(self.register_one, self.names):
            pass

    def register_one(self, name: str) -> None:
        # with its status, as a kubelet registers: the node lifecycle controller sees it Ready at once
        body = {
            **node_object(name, self.gpus, {}, self.taints.get(name)),
            "status": node_status(self.gpus, self.version, self.shared_slots.get(name, 0)),
        }
        r = self.client.post("/api/v1/nodes", json=body)
        if r.status_code not in (201, 409):
            raise RuntimeError(f"create Node {name}: {r.status_code} {r.text}")
        self.patch_node_status(name)
        self.renew(name)
        with self.registered_lock:
            self.registered.append(name)

    def patch_node_status(self, name: str) -> None:
        r = self.client.patch(
            f"/api/v1/nodes/{name}/status",
            json={"status": node_status(self.gpus, self.version, self.shared_slots.get(name, 0))},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        r.raise_for_status()

    def renew(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": now_rfc3339(True)}
        r = self.client.patch(path, json={"spec": spec}, headers={"Content-Type": "application/merge-patch+json"})
        if r.status_code == 404:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": spec,
            }
            r = self.client.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", json=body)
        r.raise_for_status()

    def heartbeat_loop(self) -> None:
        while not self.stopping.wait(RENEW_INTERVAL_S):
            with self.registered_lock:
                names = list(self.registered)
            for _ in self.lease_pool.map(self.renew_logged, names):
                pass
            try:
                lapsed = self.not_ready(set(names))
            except httpx.HTTPError as exc:
                print(f"fakenodes: list nodes: {exc}", file=sys.stderr, flush=True)
                continue
            for _ in self.lease_pool.map(self.report_status, lapsed):
                pass

    def renew_logged(self, name: str) -> None:
        for attempt in range(2):  # a loaded API server drops kept-alive connections: once more on a fresh one
            try:
                self.renew(name)
                return
            except httpx.TransportError as exc:
                if attempt:
                    print(f"fakenodes: lease {name}: {exc}", file=sys.stderr, flush=True)
            except httpx.HTTPError as exc:
                print(f"fakenodes: lease {name}: {exc}", file=sys.stderr, flush=True)
                return

    def not_ready(self, names: set[str]) -> list[str]:
        """Of ``names``, the nodes whose Ready condition is not True: the node lifecycle controller set it Unknown
        when a Lease lapsed (a loaded API server), and, as a kubelet does, the agent reports its status again."""
        listing = self.client.get("/api/v1/nodes", params={"labelSelector": "kelvin.dev/e2e-fake-node=true"})
        listing.raise_for_status()
        lapsed = []
        for node in listing.json()["items"]:
            name = node["metadata"]["name"]
            conditions = node.get("status", {}).get("conditions", [])
            if name in names and not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                lapsed.append(name)
        return lapsed

    def report_status(self, name: str) -> None:
        try:
            self.patch_node_status(name)
        except httpx.HTTPError as exc:
            print(f"fakenodes: status {name}: {exc}", file=sys.stderr, flush=True)

    # ---- pods ----------------------------------------------------------------------------------------------------
    def handle(self, pod: dict[str, Any]) -> None:
        spec, meta = pod.get("spec") or {}, pod["metadata"]
        if spec.get("nodeName") not in self.node_set:
            return
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        if meta.get("deletionTimestamp"):
            # the containers "stopped": finish the graceful deletion as a kubelet does
            body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
            r = self.client.request("DELETE", path, json=body)
            if r.status_code not in (200, 404, 409):
                print(f"fakenodes: delete {path}: {r.status_code} {r.text}", file=sys.stderr, flush=True)
            return
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
        if status.get("phase") == "Running" and ready:
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        r = self.client.patch(
            f"{path}/status",
            json={"metadata": {"uid": meta["uid"]}, "status": running_status(pod)},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if r.status_code not in (200, 404, 409):
            print(f"fakenodes: status {path}: {r.status_code} {r.text}", file=sys.stderr, flush=True)

    def watch_loop(self) -> None:
        resource_version = ""
        while not self.stopping.is_set():
            try:
                if not resource_version:
                    listing = self.client.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName!="})
                    listing.raise_for_status()
                    body = listing.json()
                    for pod in body["items"]:
                        self.handle(pod)
                    resource_version = body["metadata"]["resourceVersion"]
                params = {
                    "watch": "1",
                    "fieldSelector": "spec.nodeName!=",
                    "resourceVersion": resource_version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "60",
                }
                with self.client.stream("GET", "/api/v1/pods", params=params, timeout=90) as stream:
                    stream.raise_for_status()
                    for line in stream.iter_lines():
                        if not line:
                            continue
                        event = orjson.loads(line)
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            resource_version = ""  # 410 Gone: list again
                            break
                        resource_version = obj["metadata"].get("resourceVersion", resource_version)
                        if kind in ("ADDED", "MODIFIED"):
                            self.handle(obj)
            except httpx.HTTPError as exc:
                if self.stopping.is_set():
                    return
                print(f"fakenodes: pod watch: {exc}", file=sys.stderr, flush=True)
                resource_version = ""
                time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--nodes", required=True, help="comma-separated node names")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--kubelet-version", default="v0.0.0-fake")
    parser.add_argument(
        "--taint", action="append", default=[], metavar="NODE:KEY=VALUE:EFFECT", help="a taint of one node (repeatable)"
    )
    parser.add_argument(
        "--shared-gpu-slots",
        action="append",
        default=[],
        metavar="NODE=N",
        help="kelvin.dev/shared-gpu slots one node advertises, 1..2048 (repeatable; other nodes advertise none)",
    )
    args = parser.parse_args(argv)
    taints: dict[str, list[dict[str, str]]] = {}
    for text in args.taint:
        try:
            node, rest = text.split(":", 1)
            pair, effect = rest.rsplit(":", 1)
            key, value = pair.split("=", 1)
        except ValueError:
            parser.error(f"--taint {text!r}: must be NODE:KEY=VALUE:EFFECT")
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            parser.error(f"--taint {text!r}: the effect must be NoSchedule, PreferNoSchedule or NoExecute")
        taints.setdefault(node, []).append({"key": key, "value": value, "effect": effect})
    names = [n for n in args.nodes.split(",") if n]
    if not names or not 1 <= args.gpus <= 16:
        parser.error("--nodes must name at least one node and --gpus be 1..16")
    shared_slots: dict[str, int] = {}
    for text in args.shared_gpu_slots:
        node, _, count = text.partition("=")
        if node not in names:
            parser.error(f"--shared-gpu-slots {text!r}: {node!r} is not one of --nodes")
        if not count.isascii() or not count.isdigit() or not 1 <= int(count) <= 2048:
            parser.error(f"--shared-gpu-slots {text!r}: N must be an integer 1..2048")
        shared_slots[node] = int(count)
    context = ssl.create_default_context(cafile=args.ca)
    context.load_cert_chain(args.cert, args.key)
    client = httpx.Client(base_url=args.server, verify=context, timeout=30)
    agent = Agent(client, names, args.gpus, args.kubelet_version, taints, shared_slots)
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    threads = [
        threading.Thread(target=agent.heartbeat_loop, name="leases", daemon=True),
        threading.Thread(target=agent.watch_loop, name="pods", daemon=True),
    ]
    threads[0].start()  # renewing the Leases of the nodes registered so far while the rest register
    agent.register()
    threads[1].start()
    print("ready", flush=True)
    while not agent.stopping.wait(1):
        if not all(t.is_alive() for t in threads):
            print("fakenodes: a worker thread died", file=sys.stderr, flush=True)
            return 1
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
