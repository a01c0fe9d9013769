"""The GPU catalogue (model/catalogue.py): the one per-model table, the one model-name vocabulary, and the one
topology helper (model/node_topology.py) that the exporter and the Prometheus source share (issue 15 item 2)."""

from __future__ import annotations

import importlib

import pytest
import typer

from scheduler_plugin.extender.cli import _check_fleet_model
from scheduler_plugin.model import GIB
from scheduler_plugin.model.catalogue import CATALOGUE, GENERIC, UnknownModelError, defaults_for, names, resolve
from scheduler_plugin.model.gpu_models import memory_gb
from scheduler_plugin.model.node_topology import nvlink_peers, pcie_switches
from scheduler_plugin.nvml.fake import FakeNvml
from scheduler_plugin.settings import Settings
from scheduler_plugin.simulator import thermal_model as tm
from scheduler_plugin.simulator.fleet import known_gpu_memory_bytes
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, FleetSpecError, SimulatedFleetSource

SIMULATED = [k for k, s in CATALOGUE.items() if s.thermal is not None]


def _spellings(key: str) -> list[str]:
    """Every name of a model, plus the same names in lower case and with ``_`` for ``-``."""
    out = list(names(CATALOGUE[key]))
    return out + [n.lower() for n in out] + [n.replace("-", "_") for n in out]


def _extender_accepts(name: str) -> bool:
    try:
        _check_fleet_model(Settings(source="simulated", fleet_model=name))
    except typer.Exit as exc:
        assert exc.exit_code == 2
        return False
    return True


def _fleet_file_model(name: str) -> str:
    spec = FleetSpec.parse({"groups": [{"count": 1, "gpus": 2, "model": name}]}, source="fleet file")
    return spec.groups[0].model


@pytest.mark.parametrize("key", list(CATALOGUE))
def test_every_model_input_reads_the_same_names(key: str) -> None:
    """The exporter's fake NVML, a fleet file, ``kelvin extender --fleet-model`` and the trace simulator read the
    same names as the same model."""
    spec = CATALOGUE[key]
    for name in _spellings(key):
        assert FakeNvml(1, name).spec is spec, name
        assert known_gpu_memory_bytes(name) == spec.memory_gb * GIB, name
        if key in SIMULATED:
            assert _fleet_file_model(name) == key, name
            assert FleetSpec.uniform(2, 8, name).groups[0].model == key, name
            assert _extender_accepts(name), name
        else:  # known, but the simulated fleet has no thermal figures for it: refused, naming the ones it has
            with pytest.raises(FleetSpecError, match=r"no thermal figures.*simulated models: H100-SXM-80GB"):
                _fleet_file_model(name)
            assert not _extender_accepts(name)


def test_the_exporters_names_run_in_the_simulated_fleet() -> None:
    """Issue 15: ``kelvin extender --fleet-model A100-SXM-80GB`` was refused while the exporter lists that name."""
    assert _extender_accepts("A100-SXM-80GB")
    assert _extender_accepts("A100-SXM4-80GB")
    assert FakeNvml(1, "A100-SXM4-80GB").spec is FakeNvml(1, "A100-SXM-80GB").spec


@pytest.mark.parametrize("bad", ["Z9000", "H100", "A100-SXM-60GB", ""])
def test_a_bad_name_is_refused_everywhere_naming_the_valid_ones(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=rf"fake model: unknown GPU model {bad!r}; known models: H100-SXM-80GB, "):
        FakeNvml(1, bad)
    if bad:  # an empty model is refused by the fleet file's own min_length first
        with pytest.raises(FleetSpecError, match=rf"groups\.0\.model: unknown GPU model {bad!r}; known models: H100"):
            _fleet_file_model(bad)
    assert not _extender_accepts(bad)
    err = capsys.readouterr().err
    assert f"fleet_model (KELVIN_FLEET_MODEL, --fleet-model): unknown GPU model {bad!r}; known models: H100" in err
    with pytest.raises(UnknownModelError):
        resolve(bad)


@pytest.mark.parametrize("key", list(CATALOGUE))
def test_the_catalogue_is_the_only_table(key: str) -> None:
    """Telemetry defaults, the fake NVML, the thermal model, the simulated fleet, the trace simulator and the name
    matcher all give each model the catalogue's figures."""
    spec = CATALOGUE[key]
    assert defaults_for(spec.name) is spec  # what the Prometheus source and the exporter assume
    fake = FakeNvml(2, key)
    assert fake.spec is spec and fake.gpus[0].nvlink_links == (spec.nvlink_links if spec.nvswitch else 0)
    assert memory_gb(spec.name) in (None, spec.memory_gb)  # the name matcher's implied sizes agree
    if spec.thermal is None:
        assert key not in tm.PROFILES
        return
    params = tm.PROFILES[key]
    assert params == tm.params_for(spec) and tm.profile_for(spec.name) == params
    assert (params.throttle_onset_c, params.throttle_floor_c) == (
        spec.thermal.throttle_onset_c,
        spec.thermal.throttle_floor_c,
    )
    assert params.max_clock_mhz == spec.sm_clock_max_mhz and params.tdp_w == spec.thermal.tdp_w
    gpu = SimulatedFleetSource(FleetSpec.uniform(1, 2, key)).snapshot_nodes(0.0)[0].gpus[0]
    assert gpu.memory_total_bytes == spec.memory_gb * GIB
    assert gpu.shutdown_celsius == spec.shutdown_celsius and gpu.sm_clock_max_mhz == spec.sm_clock_max_mhz
    # the simulated GPUs report where their clocks start to drop: NVML's max operating temperature, at or below
    # NVML's slowdown threshold (a separate figure, not a second slowdown table)
    assert gpu.slowdown_celsius == spec.thermal.throttle_onset_c <= spec.slowdown_celsius


def test_no_second_table_is_left() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("scheduler_plugin.telemetry.model_defaults")
    assert defaults_for("Voodoo5") is GENERIC
    assert tm.PROFILES.keys() == set(SIMULATED)


def test_telemetry_spellings_find_their_entry() -> None:
    assert defaults_for("NVIDIA H100 80GB HBM3").key == "H100-SXM-80GB"
    assert defaults_for("NVIDIA H100 NVL").key == "H100-PCIE-80GB"
    assert defaults_for("NVIDIA A100-PCIE-40GB").key == "A100-PCIE-40GB"
    assert defaults_for("NVIDIA A100 80GB PCIe").key == "A100-PCIE-80GB"
    assert defaults_for("Tesla V100-SXM2-16GB") is GENERIC  # not the 32 GB entry: its memory would be wrong


# -- topology helper -----------------------------------------------------------------------------------------------


def test_pcie_switches_group_transitively_and_name_the_lowest_gpu() -> None:
    pix, pxb, node = 10.0, 20.0, 40.0
    levels = {
        0: {1: pix, 2: node, 3: node},
        1: {0: pix, 2: pxb, 3: node},
        2: {1: pxb, 3: node},
        3: {0: node, 1: node, 2: node, 9: pix},  # 9 is no GPU of this node
    }
    assert pcie_switches(levels) == {0: "pcie0", 1: "pcie0", 2: "pcie0", 3: "pcie3"}
    assert pcie_switches({0: {}, 1: {}}) == {0: "", 1: ""}


def test_nvlink_peers_add_the_nvswitch_fabric_to_direct_links() -> None:
    got = nvlink_peers({0: {1}, 1: {0}, 2: set(), 3: set(), 4: {5}}, on_nvswitch={2, 3, 4})
    assert got == {
        0: frozenset({1}),
        1: frozenset({0}),
        2: frozenset({3, 4}),
        3: frozenset({2, 4}),
        4: frozenset({2, 3, 5}),
    }
