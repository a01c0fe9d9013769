"""The fake GPU fleet of the e2e suite: node names and shapes shared by the fake nodes (tests/e2e/fakenodes.py) and
the extender's simulated fleet, whose node names must be the Node objects' names."""

from __future__ import annotations

NVSWITCH_NODES = ("e2e-nvs-1", "e2e-nvs-2", "e2e-nvs-3")
PCIE_NODES = ("e2e-pcie-1",)
GPU_NODES = NVSWITCH_NODES + PCIE_NODES
GPUS_PER_NODE = 8
GPU_MODEL = "H100-SXM-80GB"
