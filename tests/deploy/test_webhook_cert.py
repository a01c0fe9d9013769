"""hack/webhook-cert.sh, the webhook certificate of a kelvin applied from manifests/kelvin.yaml (which holds no key):
the Secret it applies is the one the operator mounts, its certificate is for the webhook Service and verifies against
the CA it writes into every webhook's caBundle (a real TLS handshake), and a second run keeps the Secret."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import ROOT, Doc, by_kind, load_docs, one, pod_spec

SCRIPT = ROOT / "hack" / "webhook-cert.sh"
MANIFEST = ROOT / "manifests" / "kelvin.yaml"

# A stand-in for kubectl: answers the script's reads from the rendered manifest (and an optional existing Secret) and
# records each call (argv, stdin) as one JSON line, so the test sees exactly what would reach the API server.
FAKE_KUBECTL = r"""#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"args": args, "stdin": stdin}) + "\n")
webhooks = json.loads(os.environ["FAKE_WEBHOOKS"])
if "get" in args and "secret" in args:
    existing = os.environ.get("FAKE_SECRET_CA", "")
    if not existing:
        sys.stderr.write("Error from server (NotFound): secrets not found\n")
        sys.exit(1)
    print(existing, end="")
elif "get" in args:
    kind, name = args[args.index("get") + 1], args[args.index("get") + 2]
    print("x" * webhooks.get(f"{kind}/{name}", 0), end="")
"""


def _run(tmp_path: Path, *args: str, secret_ca: str = "") -> list[dict[str, Any]]:
    docs = load_docs(MANIFEST.read_text())
    webhooks = {
        f"{d['kind'].lower()}/{d['metadata']['name']}": len(d["webhooks"])
        for d in docs
        if d["kind"] in {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    }
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {
        **os.environ,
        "KUBECTL": str(kubectl),
        "FAKE_LOG": str(log),
        "FAKE_WEBHOOKS": json.dumps(webhooks),
        "FAKE_SECRET_CA": secret_ca,
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def _secret(calls: list[dict[str, Any]]) -> Doc:
    applied = [c for c in calls if c["args"][:1] == ["apply"]]
    assert len(applied) == 1, calls
    secret: Doc = yaml.safe_load(applied[0]["stdin"])
    return secret


def _patches(calls: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {f"{c['args'][1]}/{c['args'][2]}": json.loads(c["args"][-1]) for c in calls if c["args"][:1] == ["patch"]}


def _handshake(tmp_path: Path, secret: Doc, server_name: str) -> None:
    """An HTTPS server with the Secret's certificate and key; a client that trusts only ca.crt and checks the name."""
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    for k, v in data.items():
        (tmp_path / k).write_bytes(v)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_ctx = ssl.create_default_context(cadata=data["ca.crt"].decode())
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except ssl.SSLError:  # the client refused the certificate (the wrong-name case)
                conn.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client_ctx.wrap_socket(raw, server_hostname=server_name) as tls,
        ):
            assert tls.recv(2) == b"ok"
        t.join(10)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_certificate_serves_the_webhook_service_and_the_ca_is_in_every_caBundle(tmp_path: Path) -> None:
    docs = load_docs(MANIFEST.read_text())
    calls = _run(tmp_path)
    secret = _secret(calls)
    # the Secret the operator Deployment mounts, in its namespace, with the files its env points to
    deployment = one(docs, "Deployment", "operator")
    volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == "tls")
    assert secret["metadata"] == {**secret["metadata"], "name": volume["secret"]["secretName"]}
    assert secret["metadata"]["namespace"] == deployment["metadata"]["namespace"] == "kelvin-system"
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    env = {e["name"]: e.get("value") for c in pod_spec(deployment)["containers"] for e in c.get("env", [])}
    assert {env["KELVIN_OPERATOR_WEBHOOK__CERTFILE"], env["KELVIN_OPERATOR_WEBHOOK__PKEYFILE"]} == {
        "/etc/kelvin-tls/tls.crt",
        "/etc/kelvin-tls/tls.key",
    }
    # every webhook of both configurations gets the CA
    ca = secret["data"]["ca.crt"]
    configs = [*by_kind(docs, "MutatingWebhookConfiguration"), *by_kind(docs, "ValidatingWebhookConfiguration")]
    want = {f"{d['kind'].lower()}/{d['metadata']['name']}": len(d["webhooks"]) for d in configs}
    patches = _patches(calls)
    assert {k: len(v) for k, v in patches.items()} == want
    ops = [op for v in patches.values() for op in v]
    assert all(op["value"] == ca and op["path"].endswith("/clientConfig/caBundle") for op in ops)
    # the API server reaches the webhook as <service>.<namespace>.svc: the certificate verifies for that name
    service = one(docs, "Service", "webhook")["metadata"]["name"]
    assert {c["clientConfig"]["service"]["name"] for d in configs for c in d["webhooks"]} == {service}
    _handshake(tmp_path, secret, f"{service}.kelvin-system.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(tmp_path, secret, "other.kelvin-system.svc")
    assert not [c for c in calls if "rollout" in c["args"]]  # a first run restarts nothing: the pods wait for it


def test_a_second_run_keeps_the_secret_and_only_sets_the_caBundle(tmp_path: Path) -> None:
    calls = _run(tmp_path, secret_ca="Q0EtQlVORExF")
    assert not [c for c in calls if c["args"][:1] == ["apply"]]
    assert all(op["value"] == "Q0EtQlVORExF" for v in _patches(calls).values() for op in v)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_renew_replaces_the_secret_and_restarts_the_operator(tmp_path: Path) -> None:
    calls = _run(tmp_path, "--renew", secret_ca="Q0EtQlVORExF")
    assert _secret(calls)["data"]["ca.crt"] != "Q0EtQlVORExF"
    assert ["-n", "kelvin-system", "rollout", "restart", "deployment/kelvin-operator"] in [c["args"] for c in calls]
