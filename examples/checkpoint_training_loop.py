"""A small training loop that honours kelvin's checkpoint handshake (see docs/checkpoint-handshake.md).

Before kelvin evicts a pod annotated ``kelvin.dev/checkpoint: "true"`` (its GPU is overheating, it is a noisy
neighbour, or it exceeds its GPU memory pool), the operator writes ``kelvin.dev/checkpoint-requested=<time>`` on it.
This loop notices the request (through a downward-API file, no API permission needed to read), saves a checkpoint,
and answers ``kelvin.dev/checkpoint-done=<time>`` with a PATCH of its own pod. kelvin then evicts it; the replacement
pod resumes from the checkpoint. On SIGTERM (the eviction itself, or any other shutdown) it checkpoints once more.

Standard library only, so it drops into any training image. The "model" is a toy (a linear fit by gradient descent):
replace ``train_step`` / ``save`` / ``load`` with your framework's.

Pod wiring (see docs/checkpoint-handshake.md for the full manifest)::

    metadata.annotations: {kelvin.dev/checkpoint: "true"}
    env: POD_NAME / POD_NAMESPACE from fieldRef metadata.name / metadata.namespace
    volume "podinfo": downwardAPI items [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]
    RBAC: the pod's service account may "patch" "pods" in its namespace
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

REQUESTED = "kelvin.dev/checkpoint-requested"
DONE = "kelvin.dev/checkpoint-done"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def read_annotations(path: Path) -> dict[str, str]:
    """The downward-API annotations file: one ``key="value"`` per line (values JSON-quoted)."""
    out: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, sep, raw = line.partition("=")
        if sep:
            try:
                out[key] = json.loads(raw)
            except json.JSONDecodeError:
                out[key] = raw.strip('"')
    return out


def pending_request(annotations: dict[str, str]) -> float | None:
    """The time of a checkpoint request not yet answered, or None."""
    requested = parse_rfc3339(annotations.get(REQUESTED))
    done = parse_rfc3339(annotations.get(DONE))
    if requested is None or (done is not None and done > requested):
        return None
    return requested


def answer(api: str, namespace: str, name: str, when: float, token: str | None, ca: str | None) -> None:
    """PATCH ``kelvin.dev/checkpoint-done=<when>`` onto this pod (a JSON merge patch)."""
    body = json.dumps({"metadata": {"annotations": {DONE: rfc3339(when)}}}).encode()
    req = urllib.request.Request(
        f"{api}/api/v1/namespaces/{namespace}/pods/{name}",
        data=body,
        method="PATCH",
        headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    ctx = ssl.create_default_context(cafile=ca) if api.startswith("https") else None
    with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
        resp.read()


# --- the toy model -------------------------------------------------------------------------------------------------


def load(path: Path) -> dict[str, float]:
    try:
        state: dict[str, float] = json.loads(path.read_text())
        return state
    except (OSError, json.JSONDecodeError):
        return {"step": 0, "w": 0.0, "b": 0.0}


def save(path: Path, state: dict[str, float]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)  # atomic: a crash never leaves half a checkpoint


def train_step(state: dict[str, float], lr: float = 0.05) -> None:
    """One gradient step fitting y = 3x + 1 on a fixed grid."""
    xs = [i / 10 for i in range(-10, 11)]
    gw = sum(2 * (state["w"] * x + state["b"] - (3 * x + 1)) * x for x in xs) / len(xs)
    gb = sum(2 * (state["w"] * x + state["b"] - (3 * x + 1)) for x in xs) / len(xs)
    state["w"] -= lr * gw
    state["b"] -= lr * gb
    state["step"] += 1


def run(  # noqa: PLR0913
    *,
    steps: int,
    checkpoint: Path,
    annotations_file: Path,
    api: str,
    namespace: str,
    name: str,
    token: str | None = None,
    ca: str | None = None,
    every: int = 500,
    step_s: float = 0.0,
    stop_after_answer: bool = False,
) -> dict[str, float]:
    """Train until ``steps``, SIGTERM, or (``stop_after_answer``, for tests) the first answered request."""
    state = load(checkpoint)
    stopping = False
    answered: float | None = None  # the request already answered (the downward-API file lags the API by ~1 min)

    def on_sigterm(*_: object) -> None:
        nonlocal stopping
        stopping = True

    main_thread = threading.current_thread() is threading.main_thread()  # signals can only be caught there
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
    try:
        while state["step"] < steps and not stopping:
            train_step(state)
            if step_s:
                time.sleep(step_s)
            if state["step"] % every == 0:
                save(checkpoint, state)
            requested = pending_request(read_annotations(annotations_file))
            if requested is not None and requested != answered:
                save(checkpoint, state)
                answer(api, namespace, name, time.time(), token, ca)
                answered = requested
                print(f"step {int(state['step'])}: checkpointed at kelvin's request", flush=True)
                if stop_after_answer:
                    break
        save(checkpoint, state)  # the eviction's SIGTERM: one last checkpoint within the grace period
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    return state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--checkpoint", type=Path, default=Path("/ckpt/state.json"))
    p.add_argument("--annotations", type=Path, default=Path("/etc/podinfo/annotations"))
    p.add_argument("--step-seconds", type=float, default=0.01)
    p.add_argument("--every", type=int, default=500, help="checkpoint every this many steps anyway")
    a = p.parse_args()
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    api = os.environ.get("KUBE_API_URL") or f"https://{host}:{port}"
    token_file = SA_DIR / "token"
    token = token_file.read_text().strip() if token_file.exists() else None
    ca = str(SA_DIR / "ca.crt") if (SA_DIR / "ca.crt").exists() else None
    state = run(
        steps=a.steps,
        checkpoint=a.checkpoint,
        annotations_file=a.annotations,
        api=api,
        namespace=os.environ["POD_NAMESPACE"],
        name=os.environ["POD_NAME"],
        token=token,
        ca=ca,
        step_s=a.step_seconds,
        every=a.every,
    )
    print(f"stopped at step {int(state['step'])}: w={state['w']:.3f} b={state['b']:.3f}", flush=True)


if __name__ == "__main__":
    main()
