"""A small async Kubernetes API client (aiohttp). The only place kelvin's extender and sources talk to the API server.

It loads in-cluster credentials (service-account token + CA) or a kubeconfig (token, client certificate, or an
insecure plain-HTTP server for tests), and raises :class:`KubeError` carrying the HTTP status and the API's message.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from . import yamlfile
from .settings import kube_server_url

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(RuntimeError):
    """An API call that did not succeed. ``status`` is the HTTP status (0 when no answer came). ``sent`` is False when
    the request certainly never reached the API server (no connection could be made), so it cannot have been applied.
    """

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None, *, sent: bool = True) -> None:
        self.status = status
        self.body = dict(body or {})
        self.sent = sent
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
            doc = yamlfile.safe_load(Path(path).read_text())
        except OSError as exc:
            raise KubeError(0, f"cannot read kubeconfig {path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise KubeError(0, f"cannot read kubeconfig {path}: not valid YAML ({yamlfile.describe(exc)})") from None
        if not isinstance(doc, dict):
            raise KubeError(0, f"kubeconfig {path}: must be a mapping at the top level, got {type(doc).__name__}")
        ctx_name = context or doc.get("current-context")
        ctx = _named(doc.get("contexts"), ctx_name, "context", path)
        cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster", path)
        user = _named(doc.get("users"), ctx.get("user"), "user", path) if ctx.get("user") else {}
        ca = cluster.get("certificate-authority") or _inline(cluster.get("certificate-authority-data"))
        try:
            server = kube_server_url(str(cluster.get("server") or ""))
        except ValueError as exc:
            raise KubeError(0, f"kubeconfig {path}: cluster {ctx.get('cluster')!r}: server: {exc}") from None
        return cls(
            server=server,
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
            try:
                return cls(server=kube_server_url(server))
            except ValueError as exc:
                raise KubeError(0, f"API server URL {server!r}: {exc}") from None
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path:
            return cls.from_kubeconfig(path)
        return cls.in_cluster()


def _named(items: Any, name: Any, kind: str, path: object) -> dict[str, Any]:
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("name") == name:
            entry = item.get(kind) or {}
            if not isinstance(entry, dict):
                raise KubeError(0, f"kubeconfig {path}: {kind} {name!r} must be a mapping")
            return dict(entry)
    raise KubeError(0, f"kubeconfig {path}: no {kind} named {name!r}")


def _inline(data: str | None) -> str | None:
    if not data:
        return None
    f = tempfile.NamedTemporaryFile(prefix="kelvin-kube-", delete=False)  # noqa: SIM115 - kept for the process' life
    f.write(base64.b64decode(data))
    f.close()
    return f.name


class KubeClient:
    """JSON over aiohttp. Methods return the decoded body or raise :class:`KubeError`.

    The client may be built outside an event loop (the CLIs build it before ``asyncio.run``): its aiohttp session is
    created on the first call, inside the running loop, and reused for every later call on that loop (keep-alive
    connections). A call from another loop gets a session of its own (an aiohttp session must only be used from the
    loop that created it); sessions of loops that have since closed are dropped.
    ``timeout_s`` bounds connecting (including the wait for a pooled connection) and each read of the answer.
    """

    def __init__(self, config: KubeConfig, timeout_s: float = 10.0) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self._ssl: ssl.SSLContext | bool = True
        if config.server.startswith("https"):
            ctx = ssl.create_default_context(cafile=config.ca_file if config.ca_file and not config.insecure else None)
            if config.insecure:  # insecure-skip-tls-verify: no server check, but a client certificate still counts
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if config.cert_file and config.key_file:
                ctx.load_cert_chain(config.cert_file, config.key_file)
            self._ssl = ctx
        self._headers = {"Accept": "application/json", "User-Agent": "kelvin"}
        if config.token:
            self._headers["Authorization"] = f"Bearer {config.token}"
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._proxy: tuple[URL, aiohttp.BasicAuth | None] | None = None
        self._proxy_read = False

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is not None and not session.closed:
            return session
        for other in [lp for lp in self._sessions if lp.is_closed()]:
            _drop(self._sessions.pop(other))
        if not self._proxy_read:
            # HTTPS_PROXY / NO_PROXY, read once (aiohttp's trust_env would look them, and ~/.netrc, up in a thread on
            # every request).
            self._proxy_read = True
            try:
                self._proxy = get_env_proxy_for_url(URL(self.config.server))
            except (LookupError, ValueError):
                self._proxy = None
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=100),
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout_s, sock_read=self.timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._sessions[loop] = session
        return session

    async def close(self) -> None:
        """Close the sessions: the running loop's here, another loop's on that loop while it runs (else dropped).
        Safe when no call was ever made, and more than once."""
        current = asyncio.get_running_loop()
        sessions, self._sessions = self._sessions, {}
        for loop, session in sessions.items():
            if loop is current:
                await session.close()
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(session.close(), loop)
            else:
                _drop(session)

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
        headers = {"Content-Type": content_type} if content is not None else None
        session = self._session()
        proxy, proxy_auth = self._proxy or (None, None)
        try:
            async with session.request(
                method,
                self.config.server + path,
                data=content,
                params=params,
                headers=headers,
                proxy=proxy,
                proxy_auth=proxy_auth,
                allow_redirects=False,  # as before (httpx): the API server does not redirect; a proxy's would be wrong
            ) as resp:
                raw = await resp.read()
                status, phrase = resp.status, resp.reason or ""
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:  # asyncio's TimeoutError is the builtin
            # No connection at all (refused, DNS, no pooled connection in time): nothing was sent. Anything later (a
            # reset, a read timeout) may have come after the API server applied the request.
            never_sent = isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)
            raise KubeError(
                0, f"{method} {path}: API server unreachable: {_describe(exc)}", sent=not never_sent
            ) from exc
        data: dict[str, Any] = {}
        malformed = False
        if raw:
            try:
                parsed = orjson.loads(raw)
                data = parsed if isinstance(parsed, dict) else {"items": parsed}
                malformed = not isinstance(parsed, dict)
            except orjson.JSONDecodeError:
                data = {"message": raw.decode("utf-8", "replace")[:500]}
                malformed = True
        if status >= 300:  # the API server never redirects: a 3xx (a proxy's) did not apply the request
            raise KubeError(status, f"{method} {path}: {data.get('message', phrase)}", data)
        if malformed:
            # A success whose body is not a JSON object cannot be acted on (a caller would read it as an empty
            # object and, e.g., patch a node's taints away): treat it as an error naming the call.
            raise KubeError(
                status,
                f"{method} {path}: malformed answer from the API server (HTTP {status}, not a JSON object: "
                f"{raw.decode('utf-8', 'replace')[:200]!r})",
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


def _drop(session: aiohttp.ClientSession) -> None:
    """Let go of a session whose loop is not running (so it cannot be awaited): its connector is marked closed (no
    "Unclosed connector" warning; the connections went with the loop) and the session detached from it."""
    connector = session.connector
    session.detach()
    if connector is not None:
        connector._close()  # the synchronous part of close(); on a closed loop it only marks the connector closed


def _describe(exc: BaseException) -> str:
    """The error's text; a timeout's is often empty."""
    text = str(exc)
    if isinstance(exc, TimeoutError):
        return text or "timed out"
    return text or type(exc).__name__
