"""The policy registries are built explicitly (issue 15, item 7): the production one holds kelvin's own policies, the
simulator's adds the FGD paper's comparison policies, and a production policy file cannot select those."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from pydantic import BaseModel

from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.plugins import PRODUCTION
from scheduler_plugin.policies.registry import PolicyConfigError, Registration, Registry

PAPER_BASELINES = ("random", "dotproduct", "gpu-clustering", "gpu-packing", "best-fit")
KNOWN_SCORES = "burst, fgd, fragmentation, noise, priority, thermal, topology"


@pytest.mark.parametrize("name", PAPER_BASELINES)
def test_a_policy_file_cannot_select_a_paper_baseline(name: str) -> None:
    with pytest.raises(
        PolicyConfigError, match=rf"^scoring\.{name}: unknown score policy '{name}' \(known: {KNOWN_SCORES}\)$"
    ):
        Framework.from_config(PolicyConfig.from_mapping({"scoring": {name: {"weight": 1}}}))
    with pytest.raises(
        PolicyConfigError, match=rf"^picker: unknown picker policy '{name}' \(known: fgd, fragmentation"
    ):
        Framework.from_config(PolicyConfig.from_mapping({"picker": name}))


def test_the_operator_refuses_a_policy_file_that_selects_one(tmp_path: Path) -> None:
    """KELVIN_POLICY_FILE is read by the operator too: the same refusal, naming the file and the field."""
    from kelvin_operator.settings import ConfigError, load_operator_config

    p = tmp_path / "policy.yaml"
    p.write_text("scoring:\n  dotproduct:\n    weight: 1\n")
    with pytest.raises(ConfigError, match=rf"policy file {p}: scoring.dotproduct: unknown score policy 'dotproduct'"):
        load_operator_config(p)


def test_the_simulator_registry_is_production_plus_the_baselines() -> None:
    from scheduler_plugin.simulator.baselines import SIMULATOR

    for kind in ("filter", "score", "picker"):
        assert set(PRODUCTION.names(kind)) <= set(SIMULATOR.names(kind))  # type: ignore[arg-type]
    assert set(SIMULATOR.names("score")) - set(PRODUCTION.names("score")) == set(PAPER_BASELINES)
    cfg = PolicyConfig.from_mapping({"scoring": {"random": {"args": {"seed": 3}}}, "picker": "random"})
    fw = Framework.from_config(cfg, plugins=SIMULATOR)  # the demo's GPU-blind comparison run
    assert [ws.name for ws in fw.scorers] == ["random"] and fw.picker.name == "random"


def test_importing_a_policy_module_registers_nothing() -> None:
    """Before, every policy module added itself to one global table on import, so importing the baselines (the
    simulator, the demo) made them selectable by the extender's policy file in the same process."""
    before = [(r.kind, r.name) for r in PRODUCTION]
    for module in ("scheduler_plugin.simulator.baselines", "scheduler_plugin.demo", "scheduler_plugin.simulator.cli"):
        importlib.import_module(module)
    assert [(r.kind, r.name) for r in PRODUCTION] == before
    assert ("score", "random") not in PRODUCTION


def test_a_registry_refuses_a_name_twice_and_lists_the_known_ones() -> None:
    class Args(BaseModel):
        pass

    row = Registration("score", "x", Args, lambda a: object(), "x")
    with pytest.raises(PolicyConfigError, match="score policy 'x' registered twice"):
        Registry([row, row])
    with pytest.raises(PolicyConfigError, match="filter policy 'fit' registered twice"):
        PRODUCTION.extended([Registration("filter", "fit", Args, lambda a: object(), "")])
    with pytest.raises(PolicyConfigError, match=r"unknown picker policy 'nope' \(known: none\)"):
        Registry([row]).lookup("picker", "nope")
