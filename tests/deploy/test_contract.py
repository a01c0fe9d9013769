"""The chart against the code it runs: every container's arguments parse with the real ``kelvin`` command line, every
KELVIN_* variable it sets is a real setting and loads, and the webhook paths are the operator's handler ids."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import typer
from deploy_helpers import CHART, CI_VALUES, Doc, Render, by_kind, one, pod_spec

pytestmark = pytest.mark.helm


def _kelvin_containers(docs: list[Doc]) -> list[dict[str, Any]]:
    return [
        c
        for d in docs
        if d["kind"] in {"Deployment", "DaemonSet"}
        for c in pod_spec(d)["containers"]
        if c["image"].split(":")[0].endswith("/kelvin")
    ]


def _command() -> Any:
    """The ``kelvin`` command group (typer builds it on its own vendored click)."""
    from scheduler_plugin.cli import app

    group = typer.main.get_command(app)
    assert hasattr(group, "commands")
    return group


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_container_args_parse_with_the_kelvin_cli(render: Render, values: Path) -> None:
    group = _command()
    containers = _kelvin_containers(render(values))
    assert containers
    for c in containers:
        name, *args = c["args"]
        assert name in group.commands, f"{c['name']}: no `kelvin {name}` command"
        sub = group.commands[name]
        with sub.make_context(f"kelvin {name}", list(args)) as ctx:  # parses only, raises on an unknown option
            assert ctx.params


def test_a_wrong_flag_would_be_caught() -> None:
    sub = _command().commands["exporter"]
    with pytest.raises(Exception) as caught:  # typer's vendored click NoSuchOption
        sub.make_context("kelvin exporter", ["--fake-it"])
    assert type(caught.value).__name__ == "NoSuchOption"


def _env(container: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    out = {}
    for e in container.get("env", []):
        if "value" in e and e["name"].startswith("KELVIN_"):
            out[e["name"]] = e["value"]
    if "KELVIN_POLICY_FILE" in out:
        policy = tmp_path / "policy.yaml"
        out["KELVIN_POLICY_FILE"] = str(policy)
    for key in ("KELVIN_OPERATOR_WEBHOOK__CERTFILE", "KELVIN_OPERATOR_WEBHOOK__PKEYFILE"):
        if key in out:
            out[key] = str(tmp_path / Path(out[key]).name)
    return out


def _known_settings() -> set[str]:
    from kelvin_operator.settings import OperatorConfig
    from pydantic import BaseModel

    from scheduler_plugin.settings import Settings

    known = {f"KELVIN_{f.upper()}" for f in Settings.model_fields}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            known.add(prefix + name.upper())
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, prefix + name.upper() + "__")

    walk(OperatorConfig, "KELVIN_OPERATOR_")
    return known


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_kelvin_env_is_known_and_loads(
    render: Render, values: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kelvin_operator.settings import load_operator_config

    from scheduler_plugin.extender.app import load_policy
    from scheduler_plugin.policies.framework import Framework
    from scheduler_plugin.settings import load_settings

    docs = render(values)
    policies = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-policy")]
    policy = policies[0]["data"]["policy.yaml"] if policies else None
    known = _known_settings()
    for c in _kelvin_containers(docs):
        env = _env(c, tmp_path)
        unknown = set(env) - known
        assert not unknown, f"{c['name']}: KELVIN_* variables no component reads: {sorted(unknown)}"
        if policy is not None:
            (tmp_path / "policy.yaml").write_text(policy)
        for key in [k for k in os.environ if k.startswith("KELVIN_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = load_settings()  # raises ConfigError naming the field on a bad value
        if c["name"] == "extender":
            # what `kelvin extender` does at startup with the mounted policy: validate it, build every policy
            policy = load_policy(settings)
            Framework.from_config(policy)
        if c["name"] == "operator":
            cfg = load_operator_config(settings.policy_file)
            assert cfg.peering == "kelvin-operator" and cfg.standalone is False
            assert cfg.metrics_port == int(next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics"))
        for key in env:
            monkeypatch.delenv(key)


def test_webhook_paths_are_the_operators_handler_ids(render: Render) -> None:
    from kelvin_operator.handlers import build_registry
    from kelvin_operator.settings import load_operator_config

    from scheduler_plugin.kubeapi import KubeConfig

    async def no_runtime(_: Any) -> Any:  # never called: the registry is only inspected
        raise AssertionError("not started")

    registry = build_registry(load_operator_config(None), no_runtime, KubeConfig(server="http://127.0.0.1:1"))
    handlers = registry._webhooks.get_all_handlers()
    ids = {str(h.id): str(h.reason) for h in handlers}
    docs = render()
    for kind, reason in (
        ("ValidatingWebhookConfiguration", "validating"),
        ("MutatingWebhookConfiguration", "mutating"),
    ):
        (hook,) = one(docs, kind)["webhooks"]
        path = hook["clientConfig"]["service"]["path"].lstrip("/")
        assert path in ids, f"{kind} calls /{path}; the operator serves {sorted(ids)}"
        assert reason in ids[path].lower()
    assert (CHART / "templates" / "operator" / "validatingwebhookconfiguration.yaml").exists()
