"""values.yaml and values.schema.json: every value documented, typos rejected, the policy accepted by kelvin itself."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import CHART, Render, one, run_helm

VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-]+):(?P<rest>.*)$")


def _walk_objects(node: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            out.append((path, node))
        for k, v in node.items():
            out += _walk_objects(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _walk_objects(v, f"{path}[{i}]")
    return out


def test_schema_closes_every_object() -> None:
    schema = json.loads(SCHEMA.read_text())
    objects = _walk_objects(schema)
    assert len(objects) > 20
    open_ = [path for path, node in objects if node.get("additionalProperties") is not False]
    assert not open_, f"objects with declared properties but open to unknown keys: {open_}"


def test_schema_covers_values_yaml() -> None:
    """Every key of values.yaml is declared in the schema (else the schema would reject the chart's own defaults)."""
    schema = json.loads(SCHEMA.read_text())
    values = yaml.safe_load(VALUES.read_text())

    def check(v: Any, s: dict[str, Any], path: str) -> None:
        if isinstance(v, dict) and "properties" in s:
            for k, sub in v.items():
                assert k in s["properties"], f"{path}.{k} is not in values.schema.json"
                check(sub, s["properties"][k], f"{path}.{k}")

    check(values, schema, "")


@pytest.mark.helm
@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("scheduler.extendr.weight=3", "extendr"),
        ("exporter.podAtribution=true", "podAtribution"),
        ("monitoring.serviceMonitor.enable=true", "enable"),
        ("operator.webhook.failurePolicy=Sometimes", "failurePolicy"),
        ("extender.source=promethus", "source"),
        ("scheduler.extender.httpTimeout=5 seconds", "httpTimeout"),
    ],
)
def test_schema_rejects_typos_and_bad_values(helm_bin: str, setting: str, complaint: str) -> None:
    proc = run_helm(helm_bin, "template", "kelvin", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    assert complaint in proc.stderr, proc.stderr


def test_every_value_is_commented() -> None:  # noqa: C901
    """Each leaf value (scalar, list, {} or []) of values.yaml, or a parent key, has a "# --" comment right above."""
    lines = VALUES.read_text().splitlines()

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip())

    def documented(i: int) -> bool:
        """A helm-docs style "# -- ..." comment in the comment block right above line i."""
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            if lines[j].strip().startswith("# --"):
                return True
            j -= 1
        return False

    def parent(i: int) -> int | None:
        for j in range(i - 1, -1, -1):
            if _KEY.match(lines[j]) and indent(lines[j]) < indent(lines[i]):
                return j
        return None

    missing = []
    list_indent: int | None = None
    for i, line in enumerate(lines):
        if line.strip().startswith("- "):
            list_indent = indent(line)
            continue
        m = _KEY.match(line)
        if not m:
            continue
        if list_indent is not None and indent(line) > list_indent:
            continue  # a field of a list item: part of that list value
        list_indent = None
        rest = m["rest"].strip()
        nxt = next((x for x in lines[i + 1 :] if x.strip() and not x.strip().startswith("#")), "")
        is_leaf = (bool(rest) and not rest.startswith("#")) or nxt.lstrip().startswith("- ")
        if not is_leaf:
            continue
        k: int | None = i
        while k is not None and not documented(k):
            k = parent(k)
        if k is None:
            missing.append(f"line {i + 1}: {line.strip()}")
    assert not missing, "values without a comment:\n" + "\n".join(missing)


@pytest.mark.helm
def test_policy_in_the_chart_is_accepted_by_the_extender_and_the_operator(render: Render, tmp_path: Path) -> None:
    """The shared ConfigMap's policy.yaml loads with kelvin's own validators (what the pods do at startup)."""
    from scheduler_plugin.policies.policy_file import PolicyConfig

    cm = one(render(), "ConfigMap", "policy")
    path = tmp_path / "policy.yaml"
    path.write_text(cm["data"]["policy.yaml"])
    policy = PolicyConfig.from_yaml(path)
    assert policy.ledger.ttl_seconds == yaml.safe_load(VALUES.read_text())["policy"]["ledger"]["ttlSeconds"]
    try:
        from kelvin_operator.settings import load_operator_config
    except ImportError as exc:  # pragma: no cover - the operator package is part of this repository
        pytest.fail(f"kelvin_operator cannot be imported: {exc}")
    load_operator_config(path)


@pytest.mark.helm
def test_shared_policy_with_an_operator_section_loads_in_both(render: Render, tmp_path: Path) -> None:
    from kelvin_operator.settings import load_operator_config

    from scheduler_plugin.policies.policy_file import PolicyConfig

    cm = one(render(None, "policy.operator.dryRun=true"), "ConfigMap", "policy")
    path = tmp_path / "policy.yaml"
    path.write_text(cm["data"]["policy.yaml"])
    assert load_operator_config(path).dry_run is True
    PolicyConfig.from_yaml(path)
