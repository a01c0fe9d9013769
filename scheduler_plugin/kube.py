"""A small async Kubernetes API client (httpx). The only place kelvin's extender and sources talk to the API server.

It loads in-cluster credentials (service-account token + CA) or a kubeconfig (token, client certificate, or an
insecure plain-HTTP server for tests), and raises :class:`KubeError` carrying the HTTP status and the API's message.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(RuntimeError):
    """An API call that did not succeed. ``status`` is the HTTP status (0 when the server was unreachable)."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None) -> None:
        self.status = status
        self.body = dict(body or {})
        super().__init__(f"HTTP {status}: {message}" if status else message)

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", ""))


@dataclass(frozen=True, slots=True)
class KubeConfig:
    server: str
    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeError(0, "not running in a cluster (KUBERNETES_SERVICE_HOST is unset)")
        token = (SA_DIR / "token").read_text().strip()
        host = f"[{host}]" if ":" in host else host
        return cls(server=f"https://{host}:{port}", token=token, ca_file=str(SA_DIR / "ca.crt"))

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], context: str | None = None) -> KubeConfig:
        try:
            doc = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise KubeError(0, f"cannot read kubeconfig {path}: {exc}") from exc
        ctx_name = context or doc.get("current-context")
        ctx = _named(doc.get("contexts"), ctx_name, "context", path)
        cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster", path)
        user = _named(doc.get("users"), ctx.get("user"), "user", path) if ctx.get("user") else {}
        ca = cluster.get("certificate-authority") or _inline(cluster.get("certificate-authority-data"))
        return cls(
            server=str(cluster["server"]).rstrip("/"),
            token=user.get("token"),
            ca_file=ca,
            cert_file=user.get("client-certificate") or _inline(user.get("client-certificate-data")),
            key_file=user.get("client-key") or _inline(user.get("client-key-data")),
            insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        )

    @classmethod
    def load(cls, kubeconfig: str | None = None, server: str | None = None) -> KubeConfig:
        """Explicit server URL (tests), else a kubeconfig path or $KUBECONFIG, else in-cluster."""
        if server:
            return cls(server=server.rstrip("/"))
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path:
            return cls.from_kubeconfig(path)
        return cls.in_cluster()


def _named(items: Any, name: Any, kind: str, path: object) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            return dict(item.get(kind) or {})
    raise KubeError(0, f"kubeconfig {path}: no {kind} named {name!r}")


def _inline(data: str | None) -> str | None:
    if not data:
        return None
    f = tempfile.NamedTemporaryFile(prefix="kelvin-kube-", delete=False)  # noqa: SIM115 - kept for the process' life
    f.write(base64.b64decode(data))
    f.close()
    return f.name


class KubeClient:
    """JSON over httpx. Methods return the decoded body or raise :class:`KubeError`."""

    def __init__(self, config: KubeConfig, timeout_s: float = 10.0) -> None:
        self.config = config
        verify: ssl.SSLContext | bool = True
        if config.server.startswith("https"):
            if config.insecure:
                verify = False
            else:
                ctx = (
                    ssl.create_default_context(cafile=config.ca_file)
                    if config.ca_file
                    else ssl.create_default_context()
                )
                if config.cert_file and config.key_file:
                    ctx.load_cert_chain(config.cert_file, config.key_file)
                verify = ctx
        headers = {"Accept": "application/json", "User-Agent": "kelvin"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._http = httpx.AsyncClient(base_url=config.server, headers=headers, verify=verify, timeout=timeout_s)

    async def close(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        try:
            resp = await self._http.request(method, path, content=content, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise KubeError(0, f"{method} {path}: API server unreachable: {exc}") from exc
        data: dict[str, Any] = {}
        malformed = False
        if resp.content:
            try:
                parsed = orjson.loads(resp.content)
                data = parsed if isinstance(parsed, dict) else {"items": parsed}
                malformed = not isinstance(parsed, dict)
            except orjson.JSONDecodeError:
                data = {"message": resp.text[:500]}
                malformed = True
        if resp.status_code >= 400:
            raise KubeError(resp.status_code, f"{method} {path}: {data.get('message', resp.reason_phrase)}", data)
        if malformed:
            # A success whose body is not a JSON object cannot be acted on (a caller would read it as an empty
            # object and, e.g., patch a node's taints away): treat it as an error naming the call.
            raise KubeError(
                resp.status_code,
                f"{method} {path}: malformed answer from the API server (HTTP {resp.status_code}, not a JSON object: "
                f"{resp.text[:200]!r})",
            )
        return data

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self.request("GET", path, params=params)

    async def post(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def patch_merge(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    async def patch_json(self, path: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.request("PATCH", path, body=ops, content_type="application/json-patch+json")

    async def delete(self, path: str) -> dict[str, Any]:
        return await self.request("DELETE", path)
