"""OperatorConfig: policy file section, shared hotness, env and flag precedence, errors naming the field."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from kelvin_operator.settings import PoolMode, load_operator_config
from typer.testing import CliRunner

from scheduler_plugin.cli import app
from scheduler_plugin.settings import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return p


def test_defaults_without_file() -> None:
    cfg = load_operator_config(None)
    assert cfg.taint_effect == "NoSchedule" and cfg.pools.mode is PoolMode.WARN and not cfg.dry_run


def test_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        "hotness: {hotCelsius: 80, coolCelsius: 70}\n"
        "operator:\n  dryRun: true\n  limits: {maxTotal: 7, maxPerNamespace: 3}\n  pools: {mode: evict}\n",
    )
    cfg = load_operator_config(path)
    assert cfg.hotness.hot_celsius == 80 and cfg.limits.max_total == 7 and cfg.pools.mode is PoolMode.EVICT
    monkeypatch.setenv("KELVIN_OPERATOR_LIMITS__MAX_TOTAL", "9")
    cfg = load_operator_config(path)
    assert cfg.limits.max_total == 9 and cfg.limits.max_per_namespace == 3  # env wins, file's siblings kept
    cfg = load_operator_config(path, dry_run=False, interval_s=None)
    assert cfg.dry_run is False and cfg.interval_s == 30.0


def test_operator_hotness_overrides_shared(tmp_path: Path) -> None:
    path = write(tmp_path, "hotness: {hotCelsius: 80, coolCelsius: 70}\noperator:\n  hotness: {hotCelsius: 86}\n")
    assert load_operator_config(path).hotness.hot_celsius == 86


def test_errors_name_every_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "operator:\n  pools: {mode: destroy}\n  taintEffect: Sometimes\n  bogus: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_operator_config(path)
    text = str(exc.value)
    assert "operator.pools.mode" in text and "'destroy'" in text
    # a bad key of the file is the file's (named), not the environment's: the extender refuses it alike
    assert f"policy file {path}: " in text and "KELVIN_OPERATOR_" not in text
    assert "operator.taintEffect: " in text and "(got 'Sometimes')" in text and "operator.bogus:" in text
    monkeypatch.setenv("KELVIN_OPERATOR_INTERVAL_S", "-1")
    with pytest.raises(ConfigError, match=r"operator.intervalSeconds \(KELVIN_OPERATOR_INTERVAL_S\)"):
        load_operator_config(None)


def test_events_namespace_other_than_default_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server refuses an Event about a Node outside "default" (422; issue 20 defect 7): such a setting would
    lose every Node Event, so it stops startup naming the field instead."""
    assert load_operator_config(write(tmp_path, "operator: {eventsNamespace: default}\n")).events_namespace == "default"
    monkeypatch.setenv("KELVIN_OPERATOR_EVENTS_NAMESPACE", "kelvin-system")
    with pytest.raises(ConfigError, match=r"operator.eventsNamespace \(KELVIN_OPERATOR_EVENTS_NAMESPACE\)"):
        load_operator_config(None)


def test_unreadable_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_operator_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="operator: Input should be a valid dictionary"):
        load_operator_config(write(tmp_path, "operator: [1, 2]\n"))


def test_cli_bad_config_exits_2_with_message(tmp_path: Path) -> None:
    path = write(tmp_path, "operator:\n  limits: {maxTotal: -1}\n")
    result = CliRunner().invoke(app, ["operator", "--policy-file", str(path), "--kube-server", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "operator.limits.maxTotal" in result.output and "Traceback" not in result.output


def test_camel_case_in_every_section(tmp_path: Path) -> None:
    """The README's spelling: camelCase keys, `*_s` fields spelled out as `*Seconds`, in the operator's sections too."""
    path = write(
        tmp_path,
        "hotness: {hotCelsius: 84, coolCelsius: 74, holdSeconds: 60, minTrendCelsiusPerMinute: 1}\n"
        "operator:\n  dryRun: true\n  intervalSeconds: 10\n  taintEffect: PreferNoSchedule\n"
        "  limits: {maxPerNodePerCycle: 2, windowSeconds: 300}\n  protection: {minPodAgeSeconds: 60}\n"
        "  pools: {graceSeconds: 30, toleranceRatio: 0.1}\n  webhook: {mpsLabel: x/mps, sharedGpuResource: true}\n",
    )
    cfg = load_operator_config(path)
    assert cfg.dry_run and cfg.interval_s == 10 and cfg.taint_effect == "PreferNoSchedule"
    assert cfg.hotness.hot_celsius == 84 and cfg.hotness.hold_s == 60 and cfg.hotness.min_trend_c_per_min == 1
    assert cfg.limits.max_per_node_per_cycle == 2 and cfg.limits.window_s == 300
    assert cfg.protection.min_pod_age_s == 60 and cfg.pools.grace_s == 30 and cfg.pools.tolerance_ratio == 0.1
    assert cfg.webhook.mps_label == "x/mps" and cfg.webhook.shared_gpu_resource is True


def test_old_spelling_is_accepted_with_one_warning_per_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(
        tmp_path,
        "telemetry: {max_age_seconds: 20}\nhotness: {hot_celsius: 80, coolCelsius: 70}\n"
        "operator:\n  dry_run: true\n  limits: {max_total: 7}\n",
    )
    with caplog.at_level(logging.WARNING):
        cfg = load_operator_config(path)
    assert cfg.dry_run and cfg.limits.max_total == 7 and cfg.hotness.hot_celsius == 80
    warned = [r.getMessage() for r in caplog.records if "old snake_case spelling" in r.getMessage()]
    expected = {
        "telemetry.max_age_seconds": "telemetry.maxAgeSeconds",
        "hotness.hot_celsius": "hotness.hotCelsius",
        "operator.dry_run": "operator.dryRun",
        "operator.limits.max_total": "operator.limits.maxTotal",
    }
    assert len(warned) == len(expected), warned
    for old, new in expected.items():
        assert sum(f"{old} is the old" in w and w.endswith(f"write {new}") for w in warned) == 1, (old, warned)


def test_a_key_in_both_spellings_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"operator.dryRun: set twice, as dryRun and as dry_run"):
        load_operator_config(write(tmp_path, "operator: {dryRun: true, dry_run: false}\n"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hotness: 5\n", r"hotness: Input should be a valid dictionary"),
        ("hotness: {hotCelsius: hot}\n", r"hotness.hotCelsius: Input should be a valid number"),
        ("operator: {hotness: 5}\n", r"operator.hotness: Input should be a valid dict"),
        ("telemetry: {maxAge: 5}\n", r"telemetry.maxAge: Extra inputs are not permitted"),
        ("scoring: {thermall: {weight: 1}}\n", r"scoring.thermall: unknown score policy 'thermall'"),
        ("scoring: {thermal: {args: {nodeShare: 5}}}\n", r"scoring.thermal.args.nodeShare: Input should be less"),
        ("operatorr: {dryRun: true}\n", r"operatorr: Extra inputs are not permitted"),
    ],
)
def test_the_operator_validates_the_whole_file(tmp_path: Path, text: str, message: str) -> None:
    """A file the extender would refuse does not start the operator either, and the message names the key."""
    with pytest.raises(ConfigError, match=message):
        load_operator_config(write(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scoring: {nope: {}}\n", r"scoring.nope: unknown score policy 'nope'"),
        ("picker: best-guess\n", r"picker: unknown picker policy 'best-guess'"),
        ("scoring: {thermal: {args: {nodeShare: 5}}}\n", r"scoring.thermal.args.nodeShare: Input should be less"),
    ],
)
def test_registry_errors_name_the_policy_file(tmp_path: Path, text: str, message: str) -> None:
    """The registry's errors (unknown policy names, bad args) carry the file, as every other policy error does."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_operator_config(path)
    assert str(exc.value).startswith(f"policy file {path}: ")
    assert str(exc.value).count("policy file") == 1
    assert re.search(message, str(exc.value))


@pytest.mark.parametrize("section", ["operator", "hotness", "telemetry", "filters", "scoring", "ledger", "pickerArgs"])
def test_an_empty_section_is_an_empty_mapping(tmp_path: Path, section: str) -> None:
    """``operator:`` with nothing under it (YAML null, e.g. every key commented out) loads as {}."""
    cfg = load_operator_config(write(tmp_path, f"{section}:\n  # dryRun: true\n"))
    assert cfg == load_operator_config(write(tmp_path, f"{section}: {{}}\n"))
    assert not cfg.dry_run


def test_a_section_that_is_not_a_mapping_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "operator: [dryRun]\n")
    with pytest.raises(ConfigError, match=rf"^policy file {re.escape(str(path))}: operator: Input should be a valid"):
        load_operator_config(path)
    top = write(tmp_path, "- a\n")
    with pytest.raises(ConfigError, match=r"must be a mapping at the top level"):
        load_operator_config(top)


def test_thermal_eviction_rule_from_the_file_and_its_errors(tmp_path: Path) -> None:
    assert load_operator_config(None).thermal_eviction.rule == "pays"
    path = write(
        tmp_path, "operator:\n  thermalEviction: {rule: warm, restartSeconds: 300, maxRemainingSeconds: 7200}\n"
    )
    rule = load_operator_config(path).thermal_eviction
    assert (rule.rule, rule.restart_s, rule.max_remaining_s) == ("warm", 300.0, 7200.0)
    bad = write(tmp_path, "operator:\n  thermalEviction: {rule: sometimes, restartSeconds: -1}\n")
    with pytest.raises(ConfigError) as exc:
        load_operator_config(bad)
    text = str(exc.value)
    assert "operator.thermalEviction.rule" in text and "'sometimes'" in text
    assert "operator.thermalEviction.restartSeconds" in text
