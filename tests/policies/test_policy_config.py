"""The policy file: defaults, camelCase, YAML loading, and errors that name the field."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.plugins import PRODUCTION
from scheduler_plugin.policies.registry import PolicyConfigError

MINE = {"topology": {}, "thermal": {}, "noise": {}, "burst": {}}


def test_defaults() -> None:
    cfg = PolicyConfig()
    assert cfg.telemetry.max_age_seconds == 30.0
    assert cfg.telemetry.on_stale == "deny"
    assert cfg.filters.thermal_hard_limits is True
    assert set(cfg.scoring) == {"fragmentation", "topology", "thermal", "noise", "burst"}
    assert cfg.ledger.ttl_seconds == 30.0


def test_yaml_camel_case(tmp_path: Path) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text(
        """
telemetry: {maxAgeSeconds: 12, onStale: allow}
filters: {thermalHardLimits: false, slowdownMarginCelsius: 2}
scoring:
  thermal: {weight: 3, args: {horizonSeconds: 120, comfortableHeadroomCelsius: 20}}
  topology: {weight: 1}
picker: topology
ledger: {ttlSeconds: 45}
""",
        encoding="utf-8",
    )
    cfg = PolicyConfig.from_yaml(p)
    assert cfg.telemetry.max_age_seconds == 12
    assert cfg.telemetry.on_stale == "allow"
    assert cfg.filters.thermal_hard_limits is False
    assert cfg.scoring["thermal"].weight == 3
    fw = Framework.from_config(cfg)
    assert [ws.name for ws in fw.scorers] == ["thermal", "topology"]
    thermal = fw.scorers[0].plugin
    assert thermal.args.horizon_seconds == 120  # type: ignore[attr-defined]
    assert fw.ledger is not None
    assert fw.ledger.ttl_s == 45


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"scoring": {"thermal": {"weight": -1}}},
            "scoring.thermal.weight: Input should be greater than or equal to 0",
        ),
        ({"telemetry": {"onStale": "maybe"}}, "telemetry.onStale: Input should be 'allow' or 'deny'"),
        ({"telemetry": {"maxAgeSeconds": 0}}, "telemetry.maxAgeSeconds: Input should be greater than 0"),
        ({"telemetry": {"maxAge": 5}}, "telemetry.maxAge: Extra inputs are not permitted"),
        ({"filters": {"thermalHardLimits": "sometimes"}}, "filters.thermalHardLimits: Input should be a valid boolean"),
        ({"ledger": {"ttlSeconds": -3}}, "ledger.ttlSeconds: Input should be greater than 0"),
        ({"scoring": {"thermal": {"wieght": 1}}}, "scoring.thermal.wieght: Extra inputs are not permitted"),
        ({"scoring": ["thermal"]}, "scoring: Input should be a valid dictionary"),
    ],
)
def test_structural_errors_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyConfigError) as exc:
        PolicyConfig.from_mapping(data)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"scoring": {"thermall": {}}, "picker": "topology"}, "scoring.thermall: unknown score policy 'thermall'"),
        (
            {"scoring": {"thermal": {"args": {"horizonSeconds": -1}}}, "picker": "topology"},
            "scoring.thermal.args.horizonSeconds: Input should be greater than or equal to 0",
        ),
        (
            {"scoring": {"noise": {"args": {"loudness": 1}}}, "picker": "topology"},
            "scoring.noise.args.loudness: Extra inputs are not permitted",
        ),
        ({"scoring": MINE, "picker": "best-guess"}, "picker: unknown picker policy 'best-guess'"),
        (
            {"scoring": MINE, "picker": "topology", "pickerArgs": {"nvlink": 2}},
            "pickerArgs.nvlink: Input should be less than or equal to 1",
        ),
    ],
)
def test_plugin_errors_name_the_field(data: dict[str, object], message: str) -> None:
    cfg = PolicyConfig.from_mapping(data)
    with pytest.raises(PolicyConfigError) as exc:
        Framework.from_config(cfg)
    assert message in str(exc.value)


def test_yaml_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyConfigError, match="cannot read the policy file"):
        PolicyConfig.from_yaml(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("scoring: [unclosed", encoding="utf-8")
    with pytest.raises(PolicyConfigError, match="not valid YAML"):
        PolicyConfig.from_yaml(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42", encoding="utf-8")
    with pytest.raises(PolicyConfigError, match="must be a mapping at the top level"):
        PolicyConfig.from_yaml(scalar)
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert PolicyConfig.from_yaml(empty) == PolicyConfig()


def test_default_config_builds() -> None:
    assert "fragmentation" in PRODUCTION.names("score")
    fw = Framework.from_config(PolicyConfig())
    assert {ws.name for ws in fw.scorers} == {"fragmentation", "topology", "thermal", "noise", "burst"}


def test_hotness_is_camel_case_too() -> None:
    """The shared hotness section speaks the file's one key style (`*_s` fields spelled out: holdSeconds)."""
    cfg = PolicyConfig.from_mapping(
        {"hotness": {"hotCelsius": 84, "coolCelsius": 74, "holdSeconds": 60, "minTrendCelsiusPerMinute": 1}}
    )
    assert (cfg.hotness.hot_celsius, cfg.hotness.hold_s, cfg.hotness.min_trend_c_per_min) == (84, 60, 1)
    with pytest.raises(PolicyConfigError, match=r"hotness.holdSeconds: Input should be greater than or equal to 0"):
        PolicyConfig.from_mapping({"hotness": {"holdSeconds": -1}})
    with pytest.raises(PolicyConfigError, match=r"hotness: Input should be a valid dictionary"):
        PolicyConfig.from_mapping({"hotness": 5})


def test_old_spelling_is_accepted_with_one_warning_per_key(caplog: pytest.LogCaptureFixture) -> None:
    data = {
        "telemetry": {"max_age_seconds": 12, "onStale": "allow"},
        "hotness": {"hot_celsius": 80, "cool_celsius": 70},
        "scoring": {"thermal": {"weight": 1, "args": {"node_share": 0.5}}},
        "picker_args": {},
    }
    with caplog.at_level(logging.WARNING, logger="kelvin.policy"):
        cfg = PolicyConfig.from_mapping(data, source="policy.yaml")
    assert cfg.telemetry.max_age_seconds == 12 and cfg.hotness.cool_celsius == 70
    assert Framework.from_config(cfg).scorers[0].plugin.args.node_share == 0.5  # type: ignore[attr-defined]
    warned = sorted(r.getMessage() for r in caplog.records)
    assert warned == sorted(
        f"policy.yaml: {old} is the old snake_case spelling, deprecated and refused from kelvin 0.3.0; write {new}"
        for old, new in [
            ("telemetry.max_age_seconds", "telemetry.maxAgeSeconds"),
            ("hotness.hot_celsius", "hotness.hotCelsius"),
            ("hotness.cool_celsius", "hotness.coolCelsius"),
            ("scoring.thermal.args.node_share", "scoring.thermal.args.nodeShare"),
            ("picker_args", "pickerArgs"),
        ]
    )


def test_a_key_in_both_spellings_is_refused() -> None:
    with pytest.raises(PolicyConfigError, match=r"ledger.ttlSeconds: set twice, as ttlSeconds and as ttl_seconds"):
        PolicyConfig.from_mapping({"ledger": {"ttlSeconds": 3, "ttl_seconds": 4}})
    with pytest.raises(PolicyConfigError, match=r"scoring.noise.args.utilWeight: set twice"):
        PolicyConfig.from_mapping({"scoring": {"noise": {"args": {"utilWeight": 1, "util_weight": 2}}}})


def test_hotness_cross_field_error_speaks_camel_case() -> None:
    with pytest.raises(PolicyConfigError, match=r"hotness: coolCelsius \(85.0\) must be below hotCelsius"):
        PolicyConfig.from_mapping({"hotness": {"hotCelsius": 80, "coolCelsius": 85}})


def test_empty_sections_are_empty_mappings() -> None:
    """A section key with nothing under it is YAML null: read as {} in every mapping section (so ``scoring:`` alone
    means no score policy, as ``scoring: {}`` does); a null scalar (picker) stays an error naming it."""
    sections = ["telemetry", "filters", "scoring", "pickerArgs", "ledger", "hotness", "operator"]
    nulls = PolicyConfig.from_mapping(dict.fromkeys(sections))
    assert nulls == PolicyConfig.from_mapping({k: {} for k in sections})
    assert nulls.scoring == {} and nulls.operator == {} and nulls.telemetry == PolicyConfig().telemetry
    assert PolicyConfig.from_mapping({"picker_args": None}).picker_args == {}  # the old spelling too
    with pytest.raises(PolicyConfigError, match=r"picker: Input should be a valid string"):
        PolicyConfig.from_mapping({"picker": None})


def test_empty_section_in_a_yaml_file(tmp_path: Path) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("operator:\n  # dryRun: true\nhotness:\ntelemetry:\n  maxAgeSeconds: 10\n")
    cfg = PolicyConfig.from_yaml(p)
    assert cfg.operator == {} and cfg.hotness == PolicyConfig().hotness and cfg.telemetry.max_age_seconds == 10
