#!/usr/bin/env python3
"""Writes ``properties.policy`` of helm/kelvin/values.schema.json from the pydantic models that validate the policy
file at startup, so that ``helm install``/``template`` refuses what kelvin would refuse (an unknown key, a bad value, a
weight out of range) instead of rendering pods that crash-loop on it.

The models: :class:`scheduler_plugin.policies.policy_file.PolicyConfig` (every section), the registry's args model of
each score policy and picker (``scoring.<name>.args``, ``pickerArgs``), and
:class:`kelvin_operator.settings.OperatorConfig` (the ``operator:`` section). Each model's JSON schema
(``model_json_schema``) is inlined (no ``$ref``), every field keyed by its camelCase key as the loader reads it
(:func:`scheduler_plugin.policies.keys.camel`), the old snake_case spelling kept as a ``deprecated`` property (the
loader still accepts it, with a warning); numeric bounds, enums and ``additionalProperties: false`` (models that forbid
extras) come from the models. ``scoring`` lists the registered score policies only, ``picker`` the registered pickers.
What a schema cannot say (cross-field rules such as ``hotness.coolCelsius < hotCelsius``) is still checked by kelvin at
startup.

Usage: hack/gen-values-schema.py [--check]   (--check: exit 1 when the committed file differs, print nothing else)
tests/deploy/test_values_schema_policy.py fails when the committed schema is not what this script writes.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "helm" / "kelvin" / "values.schema.json"
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from kelvin_operator.settings import OperatorConfig  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from scheduler_plugin.policies.keys import camel  # noqa: E402
from scheduler_plugin.policies.plugins import PRODUCTION  # noqa: E402
from scheduler_plugin.policies.policy_file import PolicyConfig, ScorerConfig  # noqa: E402

Schema = dict[str, Any]
DESCRIPTION = (
    "The policy file shared by the extender and the operator (docs/policies.md), generated from the models that "
    "validate it at startup by hack/gen-values-schema.py: do not edit by hand"
)


def _inline(node: Any, defs: dict[str, Schema]) -> Any:
    """``node`` with every ``$ref`` to ``#/$defs/X`` replaced by a copy of X (the models are not recursive)."""
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _inline(copy.deepcopy(defs[node["$ref"].removeprefix("#/$defs/")]), defs)
        rest = {k: _inline(v, defs) for k, v in node.items() if k != "$ref"}
        return {**target, **rest}
    return {k: _inline(v, defs) for k, v in node.items() if k not in {"$defs", "title"}}


def _camel_keys(node: Any) -> Any:
    """Each model's properties keyed as the loader reads them: ``camel(name)``, plus the old spelling, deprecated."""
    if isinstance(node, list):
        return [_camel_keys(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _camel_keys(v) for k, v in node.items() if k not in {"properties", "required"}}
    if "properties" in node:
        props: Schema = {}
        for name, sub in node["properties"].items():
            new = camel(name)
            props[new] = _camel_keys(sub)
            if new != name:
                props[name] = {**props[new], "deprecated": True, "description": f"old spelling of {new}"}
        out["properties"] = props
    if node.get("required"):
        out["required"] = [camel(n) for n in node["required"]]
    return out


def model_schema(model: type[BaseModel]) -> Schema:
    raw = model.model_json_schema(by_alias=False, mode="validation")
    schema: Schema = _camel_keys(_inline(raw, raw.get("$defs", {})))
    if model.model_config.get("extra") == "forbid":
        schema["additionalProperties"] = False
    return schema


def _scoring() -> Schema:
    scorer = model_schema(ScorerConfig)
    policies = {}
    for name in PRODUCTION.names("score"):
        args = model_schema(PRODUCTION.lookup("score", name).args_model)
        policies[name] = {**scorer, "properties": {**scorer["properties"], "args": args}}
    return {
        "type": "object",
        "description": "score policy name -> weight and args; names are the registered score policies",
        "additionalProperties": False,
        "properties": policies,
    }


def _picker_rules() -> list[Schema]:
    """``pickerArgs`` (and its old spelling) are the chosen picker's args model."""
    rules = []
    for name in PRODUCTION.names("picker"):
        args = model_schema(PRODUCTION.lookup("picker", name).args_model)
        rules.append(
            {
                "if": {"properties": {"picker": {"const": name}}},
                "then": {"properties": {"pickerArgs": args, "picker_args": args}},
            }
        )
    return rules


def policy_schema() -> Schema:
    schema = model_schema(PolicyConfig)
    props = schema["properties"]
    props["scoring"] = _scoring()
    props["picker"] = {**props["picker"], "enum": PRODUCTION.names("picker")}
    operator = model_schema(OperatorConfig)
    operator["description"] = "the operator's section (docs/operator.md)"
    props["operator"] = operator
    schema["allOf"] = _picker_rules()
    schema["description"] = DESCRIPTION
    return schema


def render(text: str) -> str:
    """The values schema ``text`` with ``properties.policy`` regenerated; everything else kept as it is."""
    values = json.loads(text)
    values["properties"]["policy"] = policy_schema()
    return json.dumps(values, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed schema is out of date")
    args = ap.parse_args(argv)
    current = SCHEMA.read_text(encoding="utf-8")
    fresh = render(current)
    if args.check:
        if fresh != current:
            print(f"error: {SCHEMA.relative_to(ROOT)} is out of date: run hack/gen-values-schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(fresh, encoding="utf-8")
    print(f"wrote {SCHEMA.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
