"""The fake GPU fleet of the e2e suite: node names and shapes shared by the fake nodes (tests/e2e/fakenodes.py) and
the extender's simulated fleet, whose node names must be the Node objects' names."""

from __future__ import annotations

NVSWITCH_NODES = ("e2e-nvs-1", "e2e-nvs-2", "e2e-nvs-3")
PCIE_NODES = ("e2e-pcie-1",)
GPU_NODES = NVSWITCH_NODES + PCIE_NODES
GPUS_PER_NODE = 8
GPU_MODEL = "H100-SXM-80GB"


def fleet_file() -> dict[str, object]:
    """The extender's simulated fleet (docs/configuration.md, the fleet file) for exactly the fake nodes: nodes
    ``<namePrefix><n>`` numbered from 1 per prefix. No initial load and no random XID errors, so placements depend
    only on what the tests create."""
    return {
        "seed": 20,
        "initialLoad": 0,
        "xidRatePerGpuHour": 0,
        "groups": [
            {"count": len(NVSWITCH_NODES), "gpus": GPUS_PER_NODE, "model": GPU_MODEL, "topology": "nvswitch",
             "namePrefix": "e2e-nvs-"},
            {"count": len(PCIE_NODES), "gpus": GPUS_PER_NODE, "model": GPU_MODEL, "topology": "pcie",
             "namePrefix": "e2e-pcie-"},
        ],
    }  # fmt: skip
