"""The fake GPU fleet of the e2e suite: node names and shapes shared by the fake nodes (tests/e2e/fakenodes.py), their
fake-NVML exporters (tests/e2e/telemetry.py: :data:`NODE_MODELS`) and the simulated fleet some scenarios still use,
whose node names must be the Node objects' names."""

from __future__ import annotations

NVSWITCH_NODES = ("e2e-nvs-1", "e2e-nvs-2", "e2e-nvs-3")
PCIE_NODES = ("e2e-pcie-1",)
GPU_NODES = NVSWITCH_NODES + PCIE_NODES
GPUS_PER_NODE = 8
GPU_MODEL = "H100-SXM-80GB"
#: The PCIe-only node's boards: H100 PCIe has no NVLink to an NVSwitch (the fake exporter reports no NVLink series)
PCIE_MODEL = "H100-PCIE-80GB"
#: The preemption scenario's node (tests/e2e/test_preemption.py): H100 SXM boards as two 4-GPU NVLink islands (GPUs
#: 0-3 and 4-7, linked within an island, not across: ``kelvin exporter --fake-nvlink-islands 2``), tainted with
#: :data:`ISLANDS_TAINT` so that only pods tolerating it (that scenario's) go there; not in :data:`GPU_NODES`, the
#: nodes every other scenario places on and counts.
ISLANDS_NODE = "e2e-islands-1"
ISLANDS = 2
ISLANDS_TAINT = {"key": "kelvin.dev/e2e-preemption", "value": "true", "effect": "NoSchedule"}
#: ``kelvin.dev/shared-gpu`` slots the islands node advertises (its fake node's ``--shared-gpu-slots``): 16 a GPU, as
#: ``kelvin device-plugin --shared-slots-per-gpu 16`` on the real kubelet node (tests/e2e/test_kubelet_node.py); the
#: nodes of :data:`GPU_NODES` advertise none
ISLANDS_SHARED_SLOTS = 16 * GPUS_PER_NODE
#: Every fake node (Node objects, exporters): the shared ones and the preemption scenario's own.
ALL_NODES = (*GPU_NODES, ISLANDS_NODE)
#: node -> the model its fake exporter reports (``kelvin exporter --fake-model``)
NODE_MODELS = {
    **dict.fromkeys(NVSWITCH_NODES, GPU_MODEL),
    **dict.fromkeys(PCIE_NODES, PCIE_MODEL),
    ISLANDS_NODE: GPU_MODEL,
}
#: node -> NVLink islands of its fake exporter (``--fake-nvlink-islands``; absent: 1, the NVSwitch fabric or none)
NODE_NVLINK_ISLANDS = {ISLANDS_NODE: ISLANDS}


def fleet_file() -> dict[str, object]:
    """The extender's simulated fleet (docs/configuration.md, the fleet file) for exactly the fake nodes: nodes
    ``<namePrefix><n>`` numbered from 1 per prefix. No initial load and no random XID errors, so placements depend
    only on what the tests create. (The simulated fleet knows no H100 PCIe model: its PCIe-only node is an H100 SXM
    board without NVLink, the same 80 GiB.)"""
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
