"""Every policy file the docs and the chart show loads in both the extender and the operator, in camelCase only.

The YAML blocks of README.md and docs/{policies,configuration,operator}.md whose top-level keys name a policy section
are policy files; the chart's are the policy ConfigMap rendered with each ci/*-values.yaml. Each must validate in the
extender (PolicyConfig + Framework, what it does at startup) and in the operator (load_operator_config, which validates
the whole file), without one warning about an old snake_case key: the docs teach the one key style.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml
from deploy_helpers import CHART, CI_VALUES, ROOT, Render, one
from kelvin_operator.settings import load_operator_config

from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.keys import camel

DOCS = ["README.md", "docs/policies.md", "docs/configuration.md", "docs/operator.md"]
SECTIONS = {camel(name) for name in PolicyConfig.model_fields}
_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.M | re.S)


def _policy_blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for i, m in enumerate(_BLOCK.finditer((ROOT / doc).read_text())):
            data = yaml.safe_load(m.group(1))
            if isinstance(data, dict) and SECTIONS & set(data):
                found.append((f"{doc}#{i}", m.group(1)))
    return found


BLOCKS = _policy_blocks()


def test_the_docs_show_policy_files() -> None:
    shown = {name.split("#")[0] for name, _ in BLOCKS}
    assert {"README.md", "docs/policies.md", "docs/operator.md"} <= shown, shown


def _loads_in_both(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        Framework.from_config(PolicyConfig.from_yaml(path))
        load_operator_config(path)
    old = [r.getMessage() for r in caplog.records if "old snake_case spelling" in r.getMessage()]
    assert not old, old


@pytest.mark.parametrize(("name", "text"), BLOCKS, ids=[n for n, _ in BLOCKS])
def test_doc_policy_example_loads_in_the_extender_and_the_operator(
    name: str, text: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    _loads_in_both(path, caplog)


def _deploys_a_policy(values: Path) -> bool:
    """The chart renders the policy ConfigMap when the scheduler or the operator is on (both are by default)."""
    doc = yaml.safe_load(values.read_text()) or {}
    return any((doc.get(part) or {}).get("enabled", True) for part in ("scheduler", "operator"))


@pytest.mark.helm
@pytest.mark.parametrize(
    "values", [None, *filter(_deploys_a_policy, CI_VALUES)], ids=lambda p: p.name if p else "defaults"
)
def test_chart_policy_loads_in_the_extender_and_the_operator(
    render: Render, values: Path | None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    docs = render(values)
    path = tmp_path / "policy.yaml"
    path.write_text(one(docs, "ConfigMap", "policy")["data"]["policy.yaml"])
    _loads_in_both(path, caplog)


def test_values_yaml_policy_is_camel_case(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load((CHART / "values.yaml").read_text())["policy"]))
    _loads_in_both(path, caplog)
