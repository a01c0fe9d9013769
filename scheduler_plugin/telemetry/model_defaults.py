"""Per-GPU-model facts that some telemetry lacks (dcgm-exporter exports no thresholds and no max clock by default).

The Prometheus source fills those fields from here when the metrics do not carry them; the fake NVML backend uses
the same table so that its GPUs look like the real ones. Values are what ``nvidia-smi -q`` reports for each board
(thresholds vary a little between VBIOS versions; override them in config when yours differ).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from ..model import MIB


@dataclass(frozen=True, slots=True)
class ModelDefaults:
    """What kelvin assumes about a GPU model when telemetry does not say."""

    name: str
    """The name NVML reports (``nvmlDeviceGetName``), e.g. ``NVIDIA H100 80GB HBM3``."""
    memory_total_bytes: int
    slowdown_celsius: float
    shutdown_celsius: float
    sm_clock_max_mhz: float
    power_limit_watts: float
    memory_max_celsius: float | None = None
    nvswitch: bool = False
    """Boards on an NVSwitch baseboard (HGX): every GPU of the node reaches every other over NVLink."""


#: Known boards, keyed by a short id. Match order matters: more specific patterns first.
KNOWN_MODELS: dict[str, ModelDefaults] = {
    "H200": ModelDefaults("NVIDIA H200", 143771 * MIB, 90.0, 92.0, 1980.0, 700.0, 95.0, nvswitch=True),
    "H100-SXM-80GB": ModelDefaults("NVIDIA H100 80GB HBM3", 81559 * MIB, 90.0, 92.0, 1980.0, 700.0, 95.0, True),
    "H100-PCIE-80GB": ModelDefaults("NVIDIA H100 PCIe", 81559 * MIB, 87.0, 90.0, 1755.0, 350.0, 95.0),
    "A100-SXM-80GB": ModelDefaults("NVIDIA A100-SXM4-80GB", 81920 * MIB, 89.0, 92.0, 1410.0, 400.0, 95.0, True),
    "A100-SXM-40GB": ModelDefaults("NVIDIA A100-SXM4-40GB", 40960 * MIB, 89.0, 92.0, 1410.0, 400.0, 95.0, True),
    "A100-PCIE-80GB": ModelDefaults("NVIDIA A100 80GB PCIe", 81920 * MIB, 89.0, 92.0, 1410.0, 300.0, 95.0),
    "L40S": ModelDefaults("NVIDIA L40S", 46068 * MIB, 88.0, 93.0, 2520.0, 350.0),
    "A10": ModelDefaults("NVIDIA A10", 23028 * MIB, 95.0, 98.0, 1695.0, 150.0),
    "T4": ModelDefaults("Tesla T4", 15360 * MIB, 94.0, 96.0, 1590.0, 70.0),
}

#: Used when the model is unknown: conservative datacenter-GPU thresholds, no clock knowledge.
GENERIC = ModelDefaults("unknown", 0, 87.0, 90.0, 0.0, 0.0)

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"H200"), "H200"),
    (re.compile(r"H100.*(PCIE|NVL)"), "H100-PCIE-80GB"),
    (re.compile(r"H100"), "H100-SXM-80GB"),
    (re.compile(r"A100.*PCIE"), "A100-PCIE-80GB"),
    (re.compile(r"A100.*40"), "A100-SXM-40GB"),
    (re.compile(r"A100"), "A100-SXM-80GB"),
    (re.compile(r"L40S"), "L40S"),
    (re.compile(r"\bA10\b"), "A10"),
    (re.compile(r"\bT4\b"), "T4"),
)


@lru_cache(maxsize=256)
def model_key(model: str) -> str | None:
    """The :data:`KNOWN_MODELS` key for a model name as NVML, dcgm-exporter or kelvin's config spell it."""
    upper = model.upper().replace("_", "-")
    if upper in KNOWN_MODELS:
        return upper
    for pattern, key in _PATTERNS:
        if pattern.search(upper):
            return key
    return None


def defaults_for(model: str, overrides: Mapping[str, ModelDefaults] | None = None) -> ModelDefaults:
    """Defaults for ``model``: an exact override, else an override or known entry under its key, else generic."""
    if overrides and model in overrides:
        return overrides[model]
    key = model_key(model)
    if key is not None:
        if overrides and key in overrides:
            return overrides[key]
        return KNOWN_MODELS[key]
    return GENERIC
