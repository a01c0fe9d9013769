"""``kelvin extender``, ``kelvin explain`` and ``kelvin demo``. Registered in ``scheduler_plugin/cli.py``.

Heavy imports (FastAPI, uvicorn, numpy policies) happen inside the commands, so ``kelvin --help`` stays fast.
Configuration errors end the command with exit code 2 and one line, ``error: ...`` naming the field, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ..console import STARTUP_FAILURE, LogLevel, LogLevelOption, console, fail, setup_logging
from ..settings import ConfigError, Settings, load_settings
from ..textfile import TextFileError, decode_problem, first_undecodable, read_text


def _fail(message: str, code: int = 2) -> NoReturn:
    fail(message, code)


def _setting(text: str, field: str, env: bool = True) -> str:
    """Help for a flag that overrides a setting: its env variable and the setting's real default (the flag's own
    default is None, so that an unset flag leaves the environment in charge). Parentheses, not brackets: rich help
    would take ``[...]`` for markup and print nothing."""
    default = Settings.model_fields[field].default
    shown = "" if default is None else f"; default {default}"
    return f"{text} (env KELVIN_{field.upper()}{shown})" if env else f"{text} (default {default})"


def _known_models() -> str:
    from ..model.catalogue import valid_names

    return valid_names(simulated=True)


def extender(
    host: Annotated[
        str | None, typer.Option(metavar="ADDRESS", help=_setting("Address of filter/prioritize/bind", "host"))
    ] = None,
    port: Annotated[
        int | None, typer.Option(metavar="PORT", help=_setting("Port of filter/prioritize/bind", "port"))
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(metavar="ADDRESS", help=_setting("Address of /metrics, /healthz, /readyz", "metrics_host")),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            metavar="PORT",
            help=_setting("Port of /metrics, /healthz, /readyz; 0 serves them on --port", "metrics_port"),
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(metavar="SOURCE", help=_setting("Telemetry source: simulated, prometheus or scrape", "source")),
    ] = None,
    policy_file: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH", help=_setting("Policy YAML (weights, thresholds); default: built-in", "policy_file")
        ),
    ] = None,
    fleet_nodes: Annotated[
        int | None, typer.Option(metavar="N", help=_setting("Simulated fleet: number of nodes", "fleet_nodes"))
    ] = None,
    fleet_gpus: Annotated[
        int | None, typer.Option(metavar="N", help=_setting("Simulated fleet: GPUs per node", "fleet_gpus_per_node"))
    ] = None,
    fleet_model: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL", help=_setting(f"Simulated fleet: GPU model, one of {_known_models()}", "fleet_model")
        ),
    ] = None,
    fleet_file: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help=_setting("Simulated fleet: YAML fleet file, overriding the other --fleet-* flags", "fleet_file"),
        ),
    ] = None,
    fleet_seed: Annotated[
        int | None, typer.Option(metavar="SEED", help=_setting("Simulated fleet: random seed", "fleet_seed"))
    ] = None,
    refresh_interval: Annotated[
        float | None,
        typer.Option(metavar="SECONDS", help=_setting("Seconds between telemetry refreshes", "refresh_interval_s")),
    ] = None,
    log_level: LogLevelOption = LogLevel.info,
) -> None:
    """Run the scheduler extender (filter, prioritize, bind, explain, /metrics, /healthz, /readyz)."""

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
        _check_fleet_model(settings)
        # A long-lived server: keep snapshots out of the cyclic collector's scans (CacheSettings.freeze_gc)
        ext = build_extender(settings, freeze_gc=True)
        servers = ExtenderServers(ext, settings, log_level=log_level.value)
    except (ConfigError, StartupError) as exc:
        _fail(f"configuration error: {exc}")
    except UnicodeDecodeError as exc:
        _fail(f"configuration error: {first_undecodable(policy_file, fleet_file) or decode_problem(exc)}")
    # Let the event loop take the GIL back every 0.5 ms instead of every 5 ms from worker threads (a source's fetch;
    # the snapshot itself is built on the loop in slices that step aside for requests).
    sys.setswitchinterval(0.0005)
    setup_logging(log_level)
    try:
        servers.run()
    except StartupError as exc:
        _fail(str(exc), STARTUP_FAILURE)


def _check_fleet_model(settings: Settings) -> None:
    """``--fleet-model``/``KELVIN_FLEET_MODEL`` must be a model the simulated fleet can run, read as every model
    name is (:func:`~scheduler_plugin.model.catalogue.resolve`; a fleet file is checked by its own loader)."""
    from ..model.catalogue import UnknownModelError, resolve

    if settings.source != "simulated" or settings.fleet_file is not None:
        return
    try:
        resolve(settings.fleet_model, simulated=True)
    except UnknownModelError as exc:
        _fail(f"configuration error: fleet_model (KELVIN_FLEET_MODEL, --fleet-model): {exc}")


def _read_docs(pod_file: Path) -> list[Any]:
    """Every YAML/JSON document of the file (``---`` separated), empty ones dropped."""
    import yaml

    from .. import yamlfile

    try:
        text = sys.stdin.read() if str(pod_file) == "-" else read_text(pod_file, "pod file")
        docs = [d for d in yamlfile.safe_load_all(text) if d is not None]
    except TextFileError as exc:
        _fail(str(exc))
    except UnicodeDecodeError as exc:  # stdin that is not UTF-8
        _fail(f"pod file {pod_file}: {decode_problem(exc)}")
    except yaml.YAMLError as exc:
        _fail(f"pod file {pod_file} is not YAML/JSON: {yamlfile.describe(exc)}")
    if not docs:
        _fail(f"pod file {pod_file}: no documents")
    return docs


def _describe(obj: Any) -> str:
    if not isinstance(obj, dict):
        return type(obj).__name__
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    return f"{obj.get('kind', 'Pod')} {name}" if name else str(obj.get("kind", "Pod"))


def _pods_to_explain(pod_file: Path, document: int | None) -> list[tuple[str, dict[str, Any]]]:
    """(label, Pod) for each document to explain. One document: it must hold a pod. Several: every document that
    is a Pod or a workload is explained and the others are skipped with a note on stderr; ``document`` (1-based)
    picks one."""
    docs = _read_docs(pod_file)
    if document is not None:
        if not 1 <= document <= len(docs):
            _fail(f"--document {document}: {pod_file} has {len(docs)} document(s)")
        docs_n = [(document, docs[document - 1])]
    else:
        docs_n = list(enumerate(docs, start=1))
    if len(docs_n) == 1:
        n, obj = docs_n[0]
        if not isinstance(obj, dict):
            _fail(f"pod file {pod_file}: must hold one Pod object")
        where = str(pod_file) if len(docs) == 1 else f"{pod_file} document {n}"
        return [(f"{where}: {_describe(obj)}", _pod_of(obj, where))]
    out: list[tuple[str, dict[str, Any]]] = []
    for n, obj in docs_n:
        where = f"{pod_file} document {n}"
        kind = obj.get("kind", "Pod") if isinstance(obj, dict) else None
        if kind != "Pod" and kind not in _TEMPLATES:
            typer.echo(f"note: skipping {where} ({_describe(obj)}): no pod to explain", err=True)
            continue
        out.append((f"{where}: {_describe(obj)}", _pod_of(obj, where)))
    if not out:
        _fail(f"{pod_file}: none of its {len(docs)} documents is a Pod or a workload ({', '.join(_TEMPLATES)})")
    return out


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
        Path,
        typer.Argument(
            metavar="POD_FILE",
            help="Pod manifest, or a workload's (its pod template); YAML or JSON, '-' for stdin. A file of several "
            "documents explains each Pod or workload in it (others are skipped with a note).",
        ),
    ],
    node: Annotated[str, typer.Argument(metavar="NODE", help="Node to explain the pod on.")],
    url: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="A running extender, e.g. http://127.0.0.1:8888. Without it: offline, on a simulated fleet.",
        ),
    ] = None,
    document: Annotated[
        int | None,
        typer.Option(min=1, metavar="N", help="Explain only this document of the file (1-based; default: all)."),
    ] = None,
    candidates: Annotated[
        list[str] | None,
        typer.Option("--candidate", metavar="NODE", help="Nodes the node competes with (repeatable; default all)."),
    ] = None,
    fleet_nodes: Annotated[
        int | None, typer.Option(metavar="N", help=_setting("Offline: simulated fleet size", "fleet_nodes"))
    ] = None,
    fleet_gpus: Annotated[
        int | None, typer.Option(metavar="N", help=_setting("Offline: GPUs per node", "fleet_gpus_per_node"))
    ] = None,
    fleet_file: Annotated[
        Path | None, typer.Option(metavar="PATH", help=_setting("Offline: fleet file", "fleet_file"))
    ] = None,
    fleet_seed: Annotated[
        int | None, typer.Option(metavar="SEED", help=_setting("Offline: fleet seed", "fleet_seed"))
    ] = None,
    policy_file: Annotated[
        Path | None,
        typer.Option(metavar="PATH", help=_setting("Offline: policy YAML; default: built-in", "policy_file")),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the raw JSON (a list when several documents are explained).")
    ] = False,
) -> None:
    """Why a pod would (not) go to a node: every filter's verdict and every policy's score and reasons."""
    pods = _pods_to_explain(pod_file, document)
    if url:
        import httpx

        def ask(pod: dict[str, Any]) -> dict[str, Any]:
            body = {"pod": pod, "node": node, "candidates": candidates or None}
            try:
                resp = httpx.post(url.rstrip("/") + "/explain", json=body, timeout=30.0)
            except httpx.HTTPError as exc:
                _fail(f"cannot reach the extender at {url}: {exc}", 1)
            data: dict[str, Any] = (
                resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
            )
            if resp.status_code != 200:
                _fail(f"explain failed (HTTP {resp.status_code}): {data.get('Error', resp.text[:300])}", 1)
            return data

        results = [(label, ask(pod)) for label, pod in pods]
    else:
        explain_one = _offline_explainer(
            fleet_nodes=fleet_nodes,
            fleet_gpus=fleet_gpus,
            fleet_file=fleet_file,
            fleet_seed=fleet_seed,
            policy_file=policy_file,
        )
        results = [(label, explain_one(pod, node, candidates or None)) for label, pod in pods]
    if as_json:
        out: Any = results[0][1] if len(results) == 1 else [{"document": lb, **d} for lb, d in results]
        typer.echo(json.dumps(out, indent=2))
        return
    several = len(results) > 1 or " document " in results[0][0]
    for i, (label, data) in enumerate(results):
        if several:  # which document of a multi-document file this is
            typer.echo(("\n" if i else "") + f"== {label}")
        print_explanation(data)


def _offline_explainer(**flags: Any) -> Any:
    """``explain(pod, node, candidates) -> dict`` on a simulated fleet built once from the flags and environment."""
    import asyncio

    from .app import StartupError, build_extender
    from .errors import WireError

    try:
        settings = load_settings(
            source="simulated",
            fleet_nodes=flags["fleet_nodes"],
            fleet_gpus_per_node=flags["fleet_gpus"],
            fleet_file=flags["fleet_file"],
            fleet_seed=flags["fleet_seed"],
            policy_file=flags["policy_file"],
        )
        _check_fleet_model(settings)
        ext = build_extender(settings)
    except (ConfigError, StartupError) as exc:
        _fail(f"configuration error: {exc}")
    except UnicodeDecodeError as exc:
        bad = first_undecodable(flags["policy_file"], flags["fleet_file"]) or decode_problem(exc)
        _fail(f"configuration error: {bad}")
    asyncio.run(ext.cache.refresh_once())

    def explain_one(pod: dict[str, Any], node: str, candidates: list[str] | None) -> dict[str, Any]:
        try:
            return ext.explain(pod, node, candidates)
        except WireError as exc:
            _fail(str(exc), 1)

    return explain_one


def print_explanation(data: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    verdict = f"score [b]{data['score']}[/b] ({data['combined']:.2f})" if data.get("fits") else "[red]filtered out[/]"
    out.print(
        f"[b]{escape(str(data['node']))}[/b] for {escape(str(data['request']))}: {verdict}"
        + (f", GPUs {escape(str(data['gpus']))}" if data.get("gpus") is not None else "")
    )
    for f in data.get("filters", []):
        mark = "[green]pass[/]" if f["passed"] else "[red]fail[/]"
        extra = "" if f["passed"] else f": {f['reason']}" + (" (unresolvable)" if f.get("unresolvable") else "")
        out.print(f"  filter {escape(str(f['filter']))}: {mark}{escape(extra)}")
    if data.get("scores"):
        t = Table(title=f"policies (normalised among {data.get('candidates')} candidates)")
        for col in ("policy", "weight", "raw", "0..10", "reasons"):
            t.add_column(col, overflow="fold")
        for s in data["scores"]:
            raw = "n/a" if s["raw"] is None else f"{s['raw']:.3f}"
            reasons = "\n".join(escape(r) for r in s["reasons"])
            t.add_row(escape(s["policy"]), f"{s['weight']:g}", raw, f"{s['normalized']:.1f}", reasons)
        out.print(t)
    for line in data.get("gpu_details", []):
        out.print(f"  {escape(line)}")
    if data.get("gang") is not None:
        from .gang_explain import describe

        for line in describe(data["gang"]):
            out.print(escape(line))


def demo(
    pods: Annotated[int, typer.Option(min=1, max=100_000, metavar="N", help="Pods to stream.")] = 200,
    nodes: Annotated[int, typer.Option(min=2, max=100_000, metavar="N", help="Simulated nodes.")] = 16,
    gpus: Annotated[int, typer.Option(min=2, max=16, metavar="N", help="GPUs per node.")] = 8,
    hot_nodes: Annotated[
        int,
        typer.Option(
            min=0, metavar="N", help="Poorly cooled nodes among them, hot from the start (a job at full power)."
        ),
    ] = 2,
    seed: Annotated[
        int, typer.Option(metavar="SEED", help="Random seed (fleet and pod stream); the same seed gives the same run.")
    ] = 0,
    interval: Annotated[
        float, typer.Option(min=0, metavar="SECONDS", help="Seconds between pods in the live table.")
    ] = 0.05,
    policy_file: Annotated[
        Path | None, typer.Option(metavar="PATH", help="Policy YAML for kelvin (default: built-in).")
    ] = None,
    live: Annotated[bool, typer.Option("--live/--no-live", help="Live table (off when not a terminal).")] = True,
    compare: Annotated[
        bool,
        typer.Option("--compare/--no-compare", help="Also run the same pods through a GPU-blind baseline and compare."),
    ] = True,
) -> None:
    """Stream pods through the extender on a simulated fleet over real HTTP, then compare with a GPU-blind baseline
    (fragmentation, hot nodes). Repeatable: the same --seed gives the same numbers."""
    from ..demo import run_demo
    from .app import StartupError

    if hot_nodes >= nodes:
        _fail(f"--hot-nodes {hot_nodes}: must be fewer than --nodes ({nodes})")
    try:
        run_demo(
            pods=pods,
            nodes=nodes,
            gpus=gpus,
            hot_nodes=hot_nodes,
            seed=seed,
            live=live,
            interval_s=interval,
            policy_file=str(policy_file) if policy_file else None,
            compare=compare,
            console=console(),
        )
    except StartupError as exc:
        _fail(f"configuration error: {exc}")
    except UnicodeDecodeError as exc:
        _fail(f"configuration error: {first_undecodable(policy_file) or decode_problem(exc)}")
