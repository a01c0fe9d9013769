"""The GPU catalogue: one table of what kelvin knows about each GPU model, and one vocabulary of model names.

Every per-model figure kelvin uses comes from :data:`CATALOGUE`: the Prometheus and scrape sources fill what
telemetry lacks from it (dcgm-exporter exports no thresholds and no max clock by default), the fake NVML reports it,
the simulated fleet sizes and heats its GPUs with it, and the trace simulator sizes GPUs by it. Values are what
``nvidia-smi -q`` reports for each board (thresholds vary a little between VBIOS versions; the Prometheus source
takes overrides).

Temperatures follow NVML's own thresholds: :attr:`GpuModelSpec.slowdown_celsius` is
``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN`` (the GPU begins hardware slowdown), :attr:`~GpuModelSpec.shutdown_celsius`
``NVML_TEMPERATURE_THRESHOLD_SHUTDOWN``, :attr:`~GpuModelSpec.memory_max_celsius`
``NVML_TEMPERATURE_THRESHOLD_MEM_MAX``. The simulated fleet's thermal model has figures of its own
(:class:`SimThermal`), a different quantity: the temperature at which its clocks start to drop (a real GPU's
software slowdown, at NVML's "max operating temperature", ``NVML_TEMPERATURE_THRESHOLD_GPU_MAX``, a few degrees below
the hardware slowdown) and the one at which they reach their floor.

Names: a model is named by its catalogue key (``H100-SXM-80GB``, ``A100-SXM-80GB``: the names the exporter's
``--fake-model`` lists), by one of its aliases (``A100-SXM4-80GB``, ``H200-SXM-141GB``) or by its NVML name
(``NVIDIA A100-SXM4-80GB``), case-insensitive, with ``-``, ``_`` and spaces alike. :func:`resolve` is the one reader
of a model name given as input (``kelvin extender --fleet-model``, a fleet file's ``model``, ``--fake-model``); it
refuses another name, listing the valid ones. :func:`lookup` also reads the many spellings telemetry reports
(``NVIDIA H100 80GB HBM3``, dcgm-exporter's ``modelName``), by family patterns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from .gpu import MIB


@dataclass(frozen=True, slots=True)
class SimThermal:
    """The simulated fleet's thermal-model figures for one model in a typical chassis (see
    :mod:`scheduler_plugin.simulator.thermal_model`)."""

    idle_w: float
    tdp_w: float
    resistance_c_per_w: float
    """Temperature rise per watt at cooling quality 1.0."""
    throttle_onset_c: float
    """The simulated GPU's clocks start to drop here (the SW thermal slowdown of NVML's max operating temperature);
    the simulated fleet reports it as the GPU's slowdown threshold, so that the thermal policy sees the throttling it
    simulates."""
    throttle_floor_c: float
    """The simulated GPU's clocks reach their floor here."""


@dataclass(frozen=True, slots=True)
class GpuModelSpec:
    """What kelvin knows about one GPU model (also what it assumes when telemetry does not say)."""

    name: str
    """The name NVML reports (``nvmlDeviceGetName``), e.g. ``NVIDIA H100 80GB HBM3``."""
    memory_total_bytes: int
    """Total memory as NVML reports it (``nvmlDeviceGetMemoryInfo``)."""
    slowdown_celsius: float
    """``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``: the GPU begins hardware slowdown."""
    shutdown_celsius: float
    """``NVML_TEMPERATURE_THRESHOLD_SHUTDOWN``."""
    sm_clock_max_mhz: float
    power_limit_watts: float
    memory_max_celsius: float | None = None
    """``NVML_TEMPERATURE_THRESHOLD_MEM_MAX``; ``None`` where the board reports none."""
    nvswitch: bool = False
    """Boards on an NVSwitch baseboard (HGX): every GPU of the node reaches every other over NVLink."""
    nvlink_links: int = 0
    """NVLink links per GPU on an NVSwitch board."""
    key: str = ""
    """The catalogue key (set by :data:`CATALOGUE`)."""
    memory_gb: int = 0
    """The memory size the board is sold as (80 for an H100 80GB); the simulators size a GPU with it, read as GiB
    (as NVIDIA sizes them)."""
    aliases: tuple[str, ...] = ()
    """Other names of the model accepted as input."""
    thermal: SimThermal | None = None
    """The simulated fleet's thermal figures; ``None``: the simulated fleet cannot run this model."""


_A100_SXM_THERMAL = SimThermal(55.0, 400.0, 0.12, 86.0, 91.0)

_SPECS = (
    GpuModelSpec(
        key="H100-SXM-80GB",
        memory_gb=80,
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=81559 * MIB,
        slowdown_celsius=90.0,
        shutdown_celsius=92.0,
        sm_clock_max_mhz=1980.0,
        power_limit_watts=700.0,
        memory_max_celsius=95.0,
        nvswitch=True,
        nvlink_links=18,
        aliases=("H100-SXM5-80GB", "H100-SXM"),
        thermal=SimThermal(70.0, 700.0, 0.065, 87.0, 92.0),
    ),
    GpuModelSpec(
        key="H200",
        memory_gb=141,
        name="NVIDIA H200",
        memory_total_bytes=143771 * MIB,
        slowdown_celsius=90.0,
        shutdown_celsius=92.0,
        sm_clock_max_mhz=1980.0,
        power_limit_watts=700.0,
        memory_max_celsius=95.0,
        nvswitch=True,
        nvlink_links=18,
        aliases=("H200-SXM-141GB", "H200-SXM"),
        thermal=SimThermal(70.0, 700.0, 0.072, 87.0, 92.0),
    ),
    GpuModelSpec(
        key="H100-PCIE-80GB",
        memory_gb=80,
        name="NVIDIA H100 PCIe",
        memory_total_bytes=81559 * MIB,
        slowdown_celsius=87.0,
        shutdown_celsius=90.0,
        sm_clock_max_mhz=1755.0,
        power_limit_watts=350.0,
        memory_max_celsius=95.0,
        aliases=("H100-PCIE",),
    ),
    GpuModelSpec(
        key="A100-SXM-80GB",
        memory_gb=80,
        name="NVIDIA A100-SXM4-80GB",
        memory_total_bytes=81920 * MIB,
        slowdown_celsius=89.0,
        shutdown_celsius=92.0,
        sm_clock_max_mhz=1410.0,
        power_limit_watts=400.0,
        memory_max_celsius=95.0,
        nvswitch=True,
        nvlink_links=12,
        aliases=("A100-SXM4-80GB",),
        thermal=_A100_SXM_THERMAL,
    ),
    GpuModelSpec(
        # the same SXM4 module and 400 W as the 80 GB part: the same thermal figures
        key="A100-SXM-40GB",
        memory_gb=40,
        name="NVIDIA A100-SXM4-40GB",
        memory_total_bytes=40960 * MIB,
        slowdown_celsius=89.0,
        shutdown_celsius=92.0,
        sm_clock_max_mhz=1410.0,
        power_limit_watts=400.0,
        memory_max_celsius=95.0,
        nvswitch=True,
        nvlink_links=12,
        aliases=("A100-SXM4-40GB",),
        thermal=_A100_SXM_THERMAL,
    ),
    GpuModelSpec(
        key="A100-PCIE-80GB",
        memory_gb=80,
        name="NVIDIA A100 80GB PCIe",
        memory_total_bytes=81920 * MIB,
        slowdown_celsius=89.0,
        shutdown_celsius=92.0,
        sm_clock_max_mhz=1410.0,
        power_limit_watts=300.0,
        memory_max_celsius=95.0,
    ),
    GpuModelSpec(
        # NVML thresholds as the A100 80GB PCIe's (same GA100 board family)
        key="A100-PCIE-40GB",
        memory_gb=40,
        name="NVIDIA A100-PCIE-40GB",
        memory_total_bytes=40960 * MIB,
        slowdown_celsius=89.0,
        shutdown_celsius=92.0,
        sm_clock_max_mhz=1410.0,
        power_limit_watts=250.0,
        memory_max_celsius=95.0,
        thermal=SimThermal(35.0, 250.0, 0.2, 85.0, 90.0),
    ),
    GpuModelSpec(
        key="L40S",
        memory_gb=48,
        name="NVIDIA L40S",
        memory_total_bytes=46068 * MIB,
        slowdown_celsius=88.0,
        shutdown_celsius=93.0,
        sm_clock_max_mhz=2520.0,
        power_limit_watts=350.0,
        aliases=("L40S-48GB",),
        thermal=SimThermal(35.0, 350.0, 0.15, 88.0, 93.0),
    ),
    GpuModelSpec(
        key="V100-SXM2-32GB",
        memory_gb=32,
        name="Tesla V100-SXM2-32GB",
        memory_total_bytes=32768 * MIB,
        slowdown_celsius=87.0,
        shutdown_celsius=90.0,
        sm_clock_max_mhz=1530.0,
        power_limit_watts=300.0,
        thermal=SimThermal(40.0, 300.0, 0.16, 85.0, 90.0),
    ),
    GpuModelSpec(
        key="A10",
        memory_gb=24,
        name="NVIDIA A10",
        memory_total_bytes=23028 * MIB,
        slowdown_celsius=95.0,
        shutdown_celsius=98.0,
        sm_clock_max_mhz=1695.0,
        power_limit_watts=150.0,
    ),
    GpuModelSpec(
        key="T4",
        memory_gb=16,
        name="Tesla T4",
        memory_total_bytes=15360 * MIB,
        slowdown_celsius=94.0,
        shutdown_celsius=96.0,
        sm_clock_max_mhz=1590.0,
        power_limit_watts=70.0,
    ),
)
#: Known boards, keyed by the exporter's names.
CATALOGUE: dict[str, GpuModelSpec] = {s.key: s for s in _SPECS}

#: Used when the model is unknown: conservative datacenter-GPU thresholds, no clock knowledge.
GENERIC = GpuModelSpec("unknown", 0, 87.0, 90.0, 0.0, 0.0, key="unknown")

#: Family patterns for the names telemetry reports; more specific first.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"H200"), "H200"),
    (re.compile(r"H100.*(PCIE|NVL)"), "H100-PCIE-80GB"),
    (re.compile(r"H100"), "H100-SXM-80GB"),
    (re.compile(r"A100.*PCIE.*40"), "A100-PCIE-40GB"),
    (re.compile(r"A100.*PCIE"), "A100-PCIE-80GB"),
    (re.compile(r"A100.*40"), "A100-SXM-40GB"),
    (re.compile(r"A100"), "A100-SXM-80GB"),
    (re.compile(r"V100.*32"), "V100-SXM2-32GB"),
    (re.compile(r"L40S"), "L40S"),
    (re.compile(r"\bA10\b"), "A10"),
    (re.compile(r"\bT4\b"), "T4"),
)

_SEPARATORS = re.compile(r"[\s_\-]+")


class UnknownModelError(ValueError):
    """A model name that is not one of the catalogue's; the message lists the valid names."""


def _norm(name: str) -> str:
    return _SEPARATORS.sub("-", name.strip().upper())


def _names() -> dict[str, str]:
    out: dict[str, str] = {}
    for key, spec in CATALOGUE.items():
        for n in (key, spec.name, *spec.aliases):
            out[_norm(n)] = key
    return out


_NAMES = _names()


def names(spec: GpuModelSpec) -> tuple[str, ...]:
    """Every name :func:`resolve` reads as ``spec``: its key, its aliases and its NVML name."""
    return (spec.key, *spec.aliases, spec.name)


def valid_names(*, simulated: bool = False) -> str:
    """The catalogue keys (those with thermal figures when ``simulated``), for messages."""
    return ", ".join(k for k, s in CATALOGUE.items() if s.thermal is not None or not simulated)


def resolve(name: str, *, simulated: bool = False) -> GpuModelSpec:
    """The catalogue entry a model name given as input names (key, alias or NVML name; case and ``-``/``_``/space
    aside). With ``simulated``, also that the simulated fleet can run it. Raises :class:`UnknownModelError` listing
    the valid names."""
    key = _NAMES.get(_norm(name))
    if key is None:
        raise UnknownModelError(f"unknown GPU model {name!r}; known models: {valid_names(simulated=simulated)}")
    spec = CATALOGUE[key]
    if simulated and spec.thermal is None:
        raise UnknownModelError(
            f"GPU model {name!r} has no thermal figures for the simulated fleet; simulated models: "
            f"{valid_names(simulated=True)}"
        )
    return spec


@lru_cache(maxsize=256)
def model_key(model: str) -> str | None:
    """The :data:`CATALOGUE` key for a model name as NVML, dcgm-exporter or kelvin's config spell it; ``None`` when
    no entry fits."""
    key = _NAMES.get(_norm(model))
    if key is not None:
        return key
    upper = model.upper().replace("_", "-")
    for pattern, k in _PATTERNS:
        if pattern.search(upper):
            return k
    return None


def lookup(model: str) -> GpuModelSpec | None:
    """The catalogue entry for a model name as telemetry reports it (see :func:`model_key`)."""
    key = model_key(model)
    return None if key is None else CATALOGUE[key]


def defaults_for(model: str, overrides: Mapping[str, GpuModelSpec] | None = None) -> GpuModelSpec:
    """What to assume for ``model``: an exact override, else an override or the entry under its key, else
    :data:`GENERIC`."""
    if overrides and model in overrides:
        return overrides[model]
    key = model_key(model)
    if key is not None:
        if overrides and key in overrides:
            return overrides[key]
        return CATALOGUE[key]
    return GENERIC
