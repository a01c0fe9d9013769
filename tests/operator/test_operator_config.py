"""OperatorConfig: policy file section, shared hotness, env and flag precedence, errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from kelvin_operator.config import PoolMode, load_operator_config
from typer.testing import CliRunner

from scheduler_plugin.cli import app
from scheduler_plugin.config import ConfigError


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
        "hotness: {hot_celsius: 80, cool_celsius: 70}\n"
        "operator:\n  dry_run: true\n  limits: {max_total: 7, max_per_namespace: 3}\n  pools: {mode: evict}\n",
    )
    cfg = load_operator_config(path)
    assert cfg.hotness.hot_celsius == 80 and cfg.limits.max_total == 7 and cfg.pools.mode is PoolMode.EVICT
    monkeypatch.setenv("KELVIN_OPERATOR_LIMITS__MAX_TOTAL", "9")
    cfg = load_operator_config(path)
    assert cfg.limits.max_total == 9 and cfg.limits.max_per_namespace == 3  # env wins, file's siblings kept
    cfg = load_operator_config(path, dry_run=False, interval_s=None)
    assert cfg.dry_run is False and cfg.interval_s == 30.0


def test_operator_hotness_overrides_shared(tmp_path: Path) -> None:
    path = write(tmp_path, "hotness: {hot_celsius: 80, cool_celsius: 70}\noperator:\n  hotness: {hot_celsius: 86}\n")
    assert load_operator_config(path).hotness.hot_celsius == 86


def test_errors_name_every_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "operator:\n  pools: {mode: destroy}\n  taint_effect: Sometimes\n  bogus: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_operator_config(path)
    text = str(exc.value)
    assert "operator.pools.mode" in text and "'destroy'" in text
    assert "operator.taint_effect" in text and "operator.bogus" in text
    monkeypatch.setenv("KELVIN_OPERATOR_INTERVAL_S", "-1")
    with pytest.raises(ConfigError, match=r"operator.interval_s \(KELVIN_OPERATOR_INTERVAL_S\)"):
        load_operator_config(None)


def test_unreadable_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_operator_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="operator: must be a mapping"):
        load_operator_config(write(tmp_path, "operator: [1, 2]\n"))


def test_cli_bad_config_exits_2_with_message(tmp_path: Path) -> None:
    path = write(tmp_path, "operator:\n  limits: {max_total: -1}\n")
    result = CliRunner().invoke(app, ["operator", "--policy-file", str(path), "--kube-server", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "operator.limits.max_total" in result.output and "Traceback" not in result.output
