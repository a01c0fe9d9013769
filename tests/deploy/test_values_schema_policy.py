"""The chart's schema of ``policy:`` is generated from the models kelvin validates the policy file with
(hack/gen-values-schema.py), is current, and refuses at ``helm template`` what kelvin would refuse at startup."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from deploy_helpers import CHART, ROOT, run_helm
from kelvin_operator.settings import read_policy_section

from scheduler_plugin.policies import PolicyConfig
from scheduler_plugin.settings import ConfigError

SCHEMA = CHART / "values.schema.json"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_values_schema", ROOT / "hack" / "gen-values-schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_schema_is_what_the_generator_writes() -> None:
    committed = SCHEMA.read_text(encoding="utf-8")
    assert _generator().render(committed) == committed, (
        "helm/kelvin/values.schema.json is out of date with the policy models: run hack/gen-values-schema.py"
    )


@pytest.mark.helm
@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("policy.scoring.thermall.weight=1", "at '/policy/scoring': additional properties 'thermall' not allowed"),
        ("policy.scoring.thermal.weight=-1", "at '/policy/scoring/thermal/weight': minimum: got -1, want 0"),
        ("policy.scoring.thermal.args.nodeShar=0.5", "'nodeShar' not allowed"),
        ("policy.telemetry.onStale=maybe", "/policy/telemetry/onStale"),
        ("policy.picker=bestfit", "/policy/picker"),
        ("policy.operator.limits.maxTotal=-1", "/policy/operator/limits/maxTotal"),
        ("policy.operator.intervalSecond=30", "'intervalSecond' not allowed"),
        ("policy.hotness.hotCelsius=0", "/policy/hotness/hotCelsius"),
    ],
)
def test_helm_refuses_a_bad_policy_naming_the_key(helm_bin: str, setting: str, complaint: str) -> None:
    proc = run_helm(helm_bin, "template", "kelvin", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"--set {setting} rendered"
    assert complaint in proc.stderr, proc.stderr


@pytest.mark.helm
def test_helm_takes_a_good_policy_in_either_spelling(helm_bin: str) -> None:
    """What kelvin loads, the schema lets through: camelCase, and the old snake_case spelling (kelvin warns).
    (``--set`` passes a fraction as a string, which the schema refuses as not a number: docs/install.md says to use
    ``--set-json`` or a values file for those.)"""
    for flag, setting in (
        ("--set-json", 'policy.scoring.thermal.args={"nodeShare": 0.5}'),
        ("--set", "policy.telemetry.max_age_seconds=10"),
        ("--set", "policy.operator.limits.maxTotal=3"),
        ("--set", "policy.picker=topology"),
    ):
        run_helm(helm_bin, "template", "kelvin", str(CHART), flag, setting)


def _kelvin_accepts(policy: dict[str, Any], tmp_path: Path) -> bool:
    """What the extender and the operator do with the file at startup."""
    path = tmp_path / "policy.yaml"
    path.write_text(json.dumps(policy))
    try:
        read_policy_section(path)  # PolicyConfig + Framework (scoring names, args), and the operator's keys
        from kelvin_operator.settings import load_operator_config

        load_operator_config(path)
    except ConfigError:
        return False
    return True


# Policy files with one change each: the schema's verdict must be kelvin's (the schema is no looser, no stricter).
CASES: list[dict[str, Any]] = [
    {},
    {"scoring": {"thermal": {"weight": 2, "args": {"nodeShare": 0.7}}}},
    {"scoring": {"thermal": {"weight": 101}}},
    {"scoring": {"thermall": {"weight": 1}}},
    {"scoring": {"fgd": {"weight": 1}}},
    {"scoring": {"dotproduct": {"weight": 1}}},
    {"picker": "random"},
    {"scoring": {"noise": {"args": {"tenantsWeight": -1}}}},
    {"scoring": {"noise": {"args": {"tenants_weight": 0}}}},
    {"telemetry": {"maxAgeSeconds": 0}},
    {"telemetry": {"onStale": "allow"}},
    {"filters": {"slowdownMarginCelsius": 31}},
    {"filters": {"hotNodes": False, "extra": 1}},
    {"ledger": {"ttlSeconds": 3600}},
    {"ledger": {"ttlSeconds": 3601}},
    {"picker": "topology", "pickerArgs": {}},
    {"picker": "nope"},
    {"hotness": {"hotCelsius": 151}},
    {"operator": {"dryRun": True, "limits": {"maxTotal": 3}}},
    {"operator": {"limits": {"maxTotal": -1}}},
    {"operator": {"taintEffect": "NoExecute"}},
    {"operator": {"taintEffect": "Sometimes"}},
    {"operator": {"pools": {"mode": "evict", "toleranceRatio": 0.1}}},
    {"operator": {"pools": {"mode": "delete"}}},
    {"operator": {"webhook": {"port": 70000}}},
    {"operator": {"unknown": 1}},
    {"nonsense": {}},
]


@pytest.mark.parametrize("policy", CASES, ids=[json.dumps(c) for c in CASES])
def test_the_schema_agrees_with_kelvin(policy: dict[str, Any], tmp_path: Path) -> None:
    schema = json.loads(SCHEMA.read_text())["properties"]["policy"]
    schema_ok = jsonschema.Draft7Validator(schema).is_valid(policy)
    assert schema_ok == _kelvin_accepts(policy, tmp_path)


def test_defaults_pass_the_schema() -> None:
    schema = json.loads(SCHEMA.read_text())["properties"]["policy"]
    defaults = PolicyConfig().model_dump(by_alias=True, mode="json")
    jsonschema.Draft7Validator(schema).validate(defaults)
