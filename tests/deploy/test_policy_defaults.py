"""The chart's default policy must be the code's default policy: a chart that spells out weights would otherwise
silently pin clusters to old defaults whenever the code's defaults improve."""

from __future__ import annotations

from pathlib import Path

import yaml

from scheduler_plugin.policies.policy_file import PolicyConfig

VALUES = Path(__file__).resolve().parents[2] / "helm" / "kelvin" / "values.yaml"


def test_chart_policy_equals_the_code_defaults() -> None:
    chart = PolicyConfig.from_mapping(yaml.safe_load(VALUES.read_text())["policy"], source=str(VALUES))
    defaults = PolicyConfig()
    assert chart.scoring == defaults.scoring
    assert chart.filters == defaults.filters
    assert chart.telemetry == defaults.telemetry
    assert chart.picker == defaults.picker
    assert chart.ledger == defaults.ledger
    assert chart.cpu_only == defaults.cpu_only
