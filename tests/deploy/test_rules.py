"""The Prometheus alerts: promtool check rules, promtool test rules (one unit test per alert), and the chart's
PrometheusRule carries exactly the checked file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_helpers import CHART, Render, one

RULES = CHART / "rules" / "kelvin-alerts.yaml"
UNIT_TESTS = Path(__file__).parent / "promtool" / "kelvin-alerts.test.yaml"
EXPECTED_ALERTS = {
    "KelvinGpuHot",
    "KelvinGpuThermalThrottling",
    "KelvinExporterNvmlDown",
    "KelvinTelemetryStale",
    "KelvinTelemetryNodesStale",
    "KelvinEvictionSpike",
    "KelvinWebhookFailures",
}


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)


def _alerts(doc: dict) -> set[str]:  # type: ignore[type-arg]
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_promtool_check_rules(promtool_bin: str) -> None:
    proc = _promtool(promtool_bin, "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in proc.stdout


def test_promtool_unit_tests(promtool_bin: str) -> None:
    proc = _promtool(promtool_bin, "test", "rules", str(UNIT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_firing_unit_test() -> None:
    assert _alerts(yaml.safe_load(RULES.read_text())) == EXPECTED_ALERTS
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    silent = {t["alertname"] for case in tests for t in case["alert_rule_test"] if not t["exp_alerts"]}
    assert fired == EXPECTED_ALERTS
    assert len(silent) >= len(EXPECTED_ALERTS) - 1  # nearly every alert is also shown not to fire too early


def test_unit_tests_fail_on_a_broken_rule(promtool_bin: str, tmp_path: Path) -> None:
    """The unit tests can fail: a rule with a raised threshold no longer fires where the tests expect it to."""
    broken = RULES.read_text().replace("kelvin_gpu_temperature_celsius >= 85", "kelvin_gpu_temperature_celsius >= 95")
    assert broken != RULES.read_text()
    (tmp_path / "rules.yaml").write_text(broken)
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    tests["rule_files"] = [str(tmp_path / "rules.yaml")]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    proc = _promtool(promtool_bin, "test", "rules", str(tmp_path / "tests.yaml"))
    assert proc.returncode != 0
    assert "KelvinGpuHot" in proc.stdout + proc.stderr


@pytest.mark.helm
def test_prometheusrule_embeds_the_checked_file(render: Render, promtool_bin: str, tmp_path: Path) -> None:
    rule = one(render(CHART / "ci" / "monitoring-values.yaml"), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump(rule["spec"]))
    proc = _promtool(promtool_bin, "check", "rules", str(tmp_path / "rendered.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
