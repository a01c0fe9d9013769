"""kelvin.dev/gpu-models items against real NVML model names (issue 10 item 2)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model.gpu_models import item_matches, matching_models, parse_model, unknown_items
from scheduler_plugin.policies.fragmentation import PodShape, Workload
from tests.fleet_helpers import dgx, fleet, request
from tests.policies.test_policy_fit import verdict

# Names as nvidia-smi / NVML report them.
A100_SXM_40 = "NVIDIA A100-SXM4-40GB"
A100_SXM_80 = "NVIDIA A100-SXM4-80GB"
A100_PCIE_80 = "NVIDIA A100 80GB PCIe"
A100_PCIE_40 = "NVIDIA A100-PCIE-40GB"
H100_SXM = "NVIDIA H100 80GB HBM3"
H100_PCIE = "NVIDIA H100 PCIe"
H100_NVL = "NVIDIA H100 NVL"
H200 = "NVIDIA H200"
H200_NVL = "NVIDIA H200 NVL"
GH200 = "NVIDIA GH200 480GB"
L4 = "NVIDIA L4"
L40 = "NVIDIA L40"
L40S = "NVIDIA L40S"
T4 = "Tesla T4"
V100 = "Tesla V100-SXM2-32GB"
V100_16 = "Tesla V100-PCIE-16GB"
A10 = "NVIDIA A10"
A10G = "NVIDIA A10G"
A30 = "NVIDIA A30"
A40 = "NVIDIA A40"
RTX6000_ADA = "NVIDIA RTX 6000 Ada Generation"
QUADRO_RTX6000 = "Quadro RTX 6000"
GH200_144 = "NVIDIA GH200 144G HBM3e"
H800 = "NVIDIA H800"
H800_PCIE = "NVIDIA H800 PCIe"
B200 = "NVIDIA B200"
GB200 = "NVIDIA GB200"
RTX_A6000 = "NVIDIA RTX A6000"
RTX4090 = "NVIDIA GeForce RTX 4090"

REAL = [
    A100_SXM_40, A100_SXM_80, A100_PCIE_80, A100_PCIE_40, H100_SXM, H100_PCIE, H100_NVL, H200, H200_NVL, GH200,
    L4, L40, L40S, T4, V100, V100_16, A10, A10G, A30, A40, RTX6000_ADA, QUADRO_RTX6000,
    GH200_144, H800, H800_PCIE, B200, GB200, RTX_A6000, RTX4090,
]  # fmt: skip

CASES = {
    "A100": {A100_SXM_40, A100_SXM_80, A100_PCIE_80, A100_PCIE_40},
    "a100": {A100_SXM_40, A100_SXM_80, A100_PCIE_80, A100_PCIE_40},
    "A100-80GB": {A100_SXM_80, A100_PCIE_80},
    "A100-40GB": {A100_SXM_40, A100_PCIE_40},
    "A100-SXM4-80GB": {A100_SXM_80},
    "A100-SXM-80GB": {A100_SXM_80},
    "A100-PCIE-80GB": {A100_PCIE_80},
    "A100 PCIe": {A100_PCIE_80, A100_PCIE_40},
    "H100": {H100_SXM, H100_PCIE, H100_NVL},
    "H100-SXM-80GB": {H100_SXM},
    "H100-80GB": {H100_SXM, H100_PCIE},
    "H100-PCIE-80GB": {H100_PCIE},
    "H100 NVL": {H100_NVL},
    "H200": {H200, H200_NVL},
    "H200-NVL": {H200_NVL},
    "GH200": {GH200, GH200_144},
    "GH200-96GB": {GH200},  # NVML's 480GB is the superchip's CPU + GPU memory
    "GH200-144GB": {GH200_144},
    "GH200 480GB": {GH200},  # the full name still matches itself
    "H800": {H800, H800_PCIE},
    "H800-80GB": {H800, H800_PCIE},
    "H800-SXM": {H800},
    "B200-180GB": {B200},
    "GB200-186GB": {GB200},
    "L40-48GB": {L40},
    "A40-48GB": {A40},
    "A10-24GB": {A10},
    "A30-24GB": {A30},
    "V100-16GB": {V100_16},
    "A6000": {RTX_A6000},
    "RTX A6000": {RTX_A6000},
    "RTX4090": {RTX4090},
    "RTX 4090": {RTX4090},
    "L4": {L4},
    "L40": {L40},
    "L40S": {L40S},
    "T4": {T4},
    "Tesla T4": {T4},
    "V100": {V100, V100_16},
    "V100-32GB": {V100},
    "A10": {A10},
    "A10G": {A10G},
    "A30": {A30},
    "A40": {A40},
    "RTX 6000 Ada": {RTX6000_ADA},
    "RTX 6000": {QUADRO_RTX6000},  # Ada is another card: an item must name it
    "RTX 6000 Ada Generation": {RTX6000_ADA},
    "NVIDIA A100-SXM4-80GB": {A100_SXM_80},
    "nvidia  h100 80gb hbm3": {H100_SXM},
    "B200": {B200},
    "B300": set(),
}


@pytest.mark.parametrize("item", sorted(CASES))
def test_items_match_real_nvml_names(item: str) -> None:
    assert {m for m in REAL if item_matches(item, m)} == CASES[item]


@pytest.mark.parametrize(
    ("item", "model"),
    [("A10", A100_SXM_80), ("A100", A10), ("L4", L40S), ("L4", L40), ("L40", L40S), ("H200", GH200), ("A10", A10G)],
)
def test_families_compare_as_whole_words(item: str, model: str) -> None:
    assert not item_matches(item, model)


@pytest.mark.parametrize(
    "name", ["H100-SXM-80GB", "H100-PCIE-80GB", "A100-SXM-80GB", "A100-SXM-40GB", "A100-PCIE-80GB"]
)
def test_our_fleet_names_match_their_family_and_themselves(name: str) -> None:
    family = name.split("-")[0]
    assert item_matches(family, name) and item_matches(name, name) and item_matches(name.lower(), name)


def test_trace_model_names_match_only_themselves() -> None:
    """The openb trace's names (``V100M16``) are compared whole: the simulator's results do not change."""
    names = ["V100M16", "V100M32", "P100", "T4", "A10", "G2", "G3", "MISC"]
    for item in names:
        assert matching_models(frozenset({item}), names) == [item]


def test_parse_model_parts() -> None:
    got = parse_model("Tesla V100-SXM2-32GB")
    assert (got.family, got.memory_gb, got.form, got.known_family) == ("V100", 32, "SXM", True)
    assert parse_model("B300-SUPER").known_family is False
    assert unknown_items(["A100", "Z900"]) == ["Z900"]


def test_filter_accepts_documented_form_on_real_names() -> None:
    """Before: an exact, case-insensitive comparison; ``A100`` never matched ``NVIDIA A100-SXM4-80GB``."""
    ok, _ = verdict(request(2, models="A100"), dgx("a", model=A100_SXM_80))
    assert ok == [True]
    ok, rej = verdict(request(2, models="A100-80GB"), dgx("a", model=A100_SXM_40))
    assert ok == [False]
    assert rej[0] == (f"needs 2 GPUs of model A100-80GB; node has 8 {A100_SXM_40}", True)
    ok, _ = verdict(request(1, models="H100"), dgx("a", model=H100_SXM), dgx("b", model=H100_PCIE))
    assert ok == [True, True]


def test_fleet_model_ids_use_the_matcher() -> None:
    f = fleet(dgx("a", model=A100_SXM_80), dgx("b", model=A10), dgx("c", model=L40S))
    ids = f.model_ids(["a100"])
    assert [f.models[i] for i in sorted(ids)] == [A100_SXM_80]
    assert [f.models[i] for i in sorted(f.model_ids(["L4"]))] == []


def test_fragmentation_access_table_uses_the_matcher() -> None:
    w = Workload.from_counts({PodShape(0, 1000, 1, frozenset({"A100"})): 1.0})
    table = w.access_table((A100_SXM_80, A10))
    assert table[:, 0].tolist() == [True, False, True]
    assert np.all(table[-1])


def test_filter_reason_names_the_nodes_models_and_an_unknown_family() -> None:
    """An item of no known family is accepted (a new GPU) but the reason says so and lists what the node has."""
    ok, rej = verdict(request(1, models="A100X"), dgx("a", model=A100_SXM_80))
    assert ok == [False]
    reason, unresolvable = rej[0]
    assert unresolvable and reason.startswith(f"needs 1 GPU of model A100X; node has 8 {A100_SXM_80} (A100X: not a")
    ok, _ = verdict(request(1, models="B300"), dgx("a", model="NVIDIA B300 SXM6 AC"))
    assert ok == [True]  # an unknown family still matches GPUs of that family
