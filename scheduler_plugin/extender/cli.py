"""``kelvin extender``, ``kelvin explain`` and ``kelvin demo``. Registered in ``scheduler_plugin/cli.py``.

Heavy imports (FastAPI, uvicorn, numpy policies) happen inside the commands, so ``kelvin --help`` stays fast.
Configuration errors end the command with exit code 2 and one message naming the field, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ..config import ConfigError, load_settings

#: Exit status of a server whose startup failed, as ``uvicorn.run`` uses.
STARTUP_FAILURE = 3


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"kelvin: {message}", err=True)
    raise typer.Exit(code)


def extender(
    host: Annotated[
        str | None,
        typer.Option(
            help="Address of filter/prioritize/bind [env KELVIN_HOST; default 127.0.0.1: the scheduler's pod]."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port of filter/prioritize/bind [env KELVIN_PORT; default 8888].")
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(help="Address of /metrics, /healthz, /readyz [env KELVIN_METRICS_HOST; default 0.0.0.0]."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Port of /metrics, /healthz, /readyz; 0 serves them on --port [env KELVIN_METRICS_PORT; default 8889]."
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(help="Telemetry source: simulated, prometheus or scrape [env KELVIN_SOURCE; default simulated]."),
    ] = None,
    policy_file: Annotated[
        Path | None, typer.Option(help="Policy YAML (weights, thresholds) [env KELVIN_POLICY_FILE].")
    ] = None,
    fleet_nodes: Annotated[int | None, typer.Option(help="Simulated fleet: number of nodes [default 64].")] = None,
    fleet_gpus: Annotated[int | None, typer.Option(help="Simulated fleet: GPUs per node [default 8].")] = None,
    fleet_model: Annotated[str | None, typer.Option(help="Simulated fleet: GPU model [default H100-SXM-80GB].")] = None,
    fleet_file: Annotated[
        Path | None, typer.Option(help="Simulated fleet: YAML fleet file (overrides the other --fleet-* shape flags).")
    ] = None,
    fleet_seed: Annotated[int | None, typer.Option(help="Simulated fleet: random seed [default 0].")] = None,
    refresh_interval: Annotated[
        float | None, typer.Option(help="Seconds between telemetry refreshes [default 5].")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn/kelvin log level.")] = "info",
) -> None:
    """Run the scheduler extender (filter, prioritize, bind, explain, /metrics, /healthz, /readyz)."""
    import logging

    from .app import StartupError, build_extender
    from .server import ExtenderServers

    try:
        settings = load_settings(
            host=host,
            port=port,
            metrics_host=metrics_host,
            metrics_port=metrics_port,
            source=source,
            policy_file=policy_file,
            fleet_nodes=fleet_nodes,
            fleet_gpus_per_node=fleet_gpus,
            fleet_model=fleet_model,
            fleet_file=fleet_file,
            fleet_seed=fleet_seed,
            refresh_interval_s=refresh_interval,
        )
        ext = build_extender(settings)
        servers = ExtenderServers(ext, settings, log_level=log_level)
    except (ConfigError, StartupError) as exc:
        _fail(f"configuration error: {exc}")
    # A long-lived server: keep snapshots out of the cyclic collector's scans, and let the event loop take the GIL
    # back every 0.5 ms instead of every 5 ms from worker threads (a source's fetch; the snapshot itself is built on
    # the loop in slices that step aside for requests).
    ext.cache.freeze_gc = True
    sys.setswitchinterval(0.0005)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        servers.run()
    except StartupError as exc:
        _fail(str(exc), STARTUP_FAILURE)


def _read_pod(pod_file: Path) -> dict[str, Any]:
    import yaml

    try:
        text = sys.stdin.read() if str(pod_file) == "-" else pod_file.read_text(encoding="utf-8")
        pod = yaml.safe_load(text)
    except OSError as exc:
        _fail(f"cannot read pod file {pod_file}: {exc.strerror or exc}")
    except yaml.YAMLError as exc:
        _fail(f"pod file {pod_file} is not YAML/JSON: {exc}")
    if not isinstance(pod, dict):
        _fail(f"pod file {pod_file}: must hold one Pod object")
    return _pod_of(pod, str(pod_file))


#: Workload kinds whose pods ``kelvin explain`` accepts, and where their pod template lives.
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def _pod_of(obj: dict[str, Any], source: str) -> dict[str, Any]:
    """The Pod to explain: the object itself, or the pod template of a workload (Deployment, Job, ...)."""
    kind = obj.get("kind", "Pod")
    if kind == "Pod":
        return obj
    path = _TEMPLATES.get(str(kind))
    if path is None:
        _fail(f"{source}: kind {kind!r} has no pod to explain (give a Pod or one of: {', '.join(_TEMPLATES)})")
    template: Any = obj
    for key in path:
        template = template.get(key) if isinstance(template, dict) else None
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        _fail(f"{source}: {kind} has no pod template at {'.'.join(path)}")
    meta = dict(template.get("metadata") or {})
    meta.setdefault("name", f"{(obj.get('metadata') or {}).get('name', 'pod')}-template")
    meta.setdefault("namespace", (obj.get("metadata") or {}).get("namespace", "default"))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def explain(
    pod_file: Annotated[
        Path, typer.Argument(help="Pod manifest, or a workload's (its pod template); YAML or JSON, '-' for stdin.")
    ],
    node: Annotated[str, typer.Argument(help="Node to explain the pod on.")],
    url: Annotated[
        str | None,
        typer.Option(help="A running extender, e.g. http://127.0.0.1:8888. Without it: offline, on a simulated fleet."),
    ] = None,
    candidates: Annotated[
        list[str] | None, typer.Option("--candidate", help="Nodes the node competes with (repeatable; default all).")
    ] = None,
    fleet_nodes: Annotated[int | None, typer.Option(help="Offline: simulated fleet size.")] = None,
    fleet_gpus: Annotated[int | None, typer.Option(help="Offline: GPUs per node.")] = None,
    fleet_file: Annotated[Path | None, typer.Option(help="Offline: fleet file.")] = None,
    fleet_seed: Annotated[int | None, typer.Option(help="Offline: fleet seed.")] = None,
    policy_file: Annotated[Path | None, typer.Option(help="Offline: policy YAML.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Why a pod would (not) go to a node: every filter's verdict and every policy's score and reasons."""
    pod = _read_pod(pod_file)
    body: dict[str, Any] = {"pod": pod, "node": node, "candidates": candidates or None}
    if url:
        import httpx

        try:
            resp = httpx.post(url.rstrip("/") + "/explain", json=body, timeout=30.0)
        except httpx.HTTPError as exc:
            _fail(f"cannot reach the extender at {url}: {exc}", 1)
        data = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        if resp.status_code != 200:
            _fail(f"explain failed (HTTP {resp.status_code}): {data.get('Error', resp.text[:300])}", 1)
    else:
        data = _explain_offline(
            body,
            fleet_nodes=fleet_nodes,
            fleet_gpus=fleet_gpus,
            fleet_file=fleet_file,
            fleet_seed=fleet_seed,
            policy_file=policy_file,
        )
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        print_explanation(data)


def _explain_offline(body: dict[str, Any], **flags: Any) -> dict[str, Any]:
    import asyncio

    from . import wire
    from .app import StartupError, build_extender

    try:
        settings = load_settings(
            source="simulated",
            fleet_nodes=flags["fleet_nodes"],
            fleet_gpus_per_node=flags["fleet_gpus"],
            fleet_file=flags["fleet_file"],
            fleet_seed=flags["fleet_seed"],
            policy_file=flags["policy_file"],
        )
        ext = build_extender(settings)
    except (ConfigError, StartupError) as exc:
        _fail(f"configuration error: {exc}")
    asyncio.run(ext.cache.refresh_once())
    try:
        return ext.explain(body["pod"], body["node"], body["candidates"])
    except wire.WireError as exc:
        _fail(str(exc), 1)


def print_explanation(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    verdict = f"score [b]{data['score']}[/b] ({data['combined']:.2f})" if data.get("fits") else "[red]filtered out[/]"
    console.print(
        f"[b]{data['node']}[/b] for {data['request']}: {verdict}"
        + (f", GPUs {data['gpus']}" if data.get("gpus") is not None else "")
    )
    for f in data.get("filters", []):
        mark = "[green]pass[/]" if f["passed"] else "[red]fail[/]"
        extra = "" if f["passed"] else f": {f['reason']}" + (" (unresolvable)" if f.get("unresolvable") else "")
        console.print(f"  filter {f['filter']}: {mark}{extra}")
    if data.get("scores"):
        t = Table(title=f"policies (normalised among {data.get('candidates')} candidates)")
        for col in ("policy", "weight", "raw", "0..10", "reasons"):
            t.add_column(col, overflow="fold")
        for s in data["scores"]:
            raw = "n/a" if s["raw"] is None else f"{s['raw']:.3f}"
            t.add_row(s["policy"], f"{s['weight']:g}", raw, f"{s['normalized']:.1f}", "\n".join(s["reasons"]))
        console.print(t)
    for line in data.get("gpu_details", []):
        console.print(f"  {line}")


def demo(
    pods: Annotated[int, typer.Option(min=1, max=100_000, help="Pods to stream.")] = 200,
    nodes: Annotated[int, typer.Option(min=1, max=100_000, help="Simulated nodes.")] = 48,
    gpus: Annotated[int, typer.Option(min=1, max=16, help="GPUs per node.")] = 8,
    seed: Annotated[int, typer.Option(help="Random seed (fleet and pod stream).")] = 0,
    interval: Annotated[float, typer.Option(min=0, help="Seconds between pods.")] = 0.05,
    policy_file: Annotated[Path | None, typer.Option(help="Policy YAML.")] = None,
    live: Annotated[bool, typer.Option("--live/--no-live", help="Live table (off when not a terminal).")] = True,
    compare: Annotated[
        bool,
        typer.Option("--compare/--no-compare", help="Also run the same pods through a GPU-blind baseline and compare."),
    ] = True,
) -> None:
    """Stream pods through the extender on a simulated fleet over real HTTP, with a live table and a summary."""
    from rich.console import Console

    from ..demo import run_demo
    from .app import StartupError

    try:
        run_demo(
            pods=pods,
            nodes=nodes,
            gpus=gpus,
            seed=seed,
            live=live,
            interval_s=interval,
            policy_file=str(policy_file) if policy_file else None,
            compare=compare,
            console=Console(),
        )
    except StartupError as exc:
        _fail(f"configuration error: {exc}")
