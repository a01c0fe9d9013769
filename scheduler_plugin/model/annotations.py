"""Every label, annotation, taint and resource name kelvin reads or writes. Documented in docs/annotations.md."""

from __future__ import annotations

PREFIX = "kelvin.dev/"

# Resources
GPU_RESOURCE = "nvidia.com/gpu"
# one slot on a shared GPU (memory pool / compute share), advertised by `kelvin device-plugin`
SHARED_GPU_RESOURCE = PREFIX + "shared-gpu"

# Pod annotations read by the extender (set by users)
GPU_MEMORY = PREFIX + "gpu-memory"  # per-GPU memory of a shared GPU, a quantity: "20Gi"
GPU_SHARE = PREFIX + "gpu-share"  # compute share of one GPU in thousandths, 1..1000: "460"
GPU_MODELS = PREFIX + "gpu-models"  # allowed GPU models, comma separated: "A100,H100"
TOPOLOGY = PREFIX + "topology"  # multi-GPU pods: "nvlink-required" | "nvlink-preferred" | "any"
MAX_TEMPERATURE = PREFIX + "max-temperature"  # Celsius: "78"
# Gangs (multi-pod jobs planned as a whole; docs/jobs.md)
GANG = PREFIX + "gang"  # the gang's name, unique in its namespace: "llama-70b"
GANG_SIZE = PREFIX + "gang-size"  # members that must all be placed at once, a positive integer: "4"
GANG_TOPOLOGY = PREFIX + "gang-topology"  # "required=<level>" | "preferred=<level>" (levels: the policy's gang:)
GANG_INDEX = PREFIX + "gang-index"  # the member's rank, 0..size-1, when no Job/JobSet/LWS index says it
GANG_ELASTIC = PREFIX + "gang-elastic"  # "true": a straggling member is moved alone, not the whole gang

# Pod annotations read by the operator (set by users)
EVICTABLE = PREFIX + "evictable"  # "false" protects the pod from kelvin's evictions
CHECKPOINT = PREFIX + "checkpoint"  # "true": ask before evicting (checkpoint handshake)
CHECKPOINT_DONE = PREFIX + "checkpoint-done"  # written by the workload: RFC 3339 timestamp

# Pod annotation read by the extender's preempt verb (set by users): the members of one gang are evicted together
GANG = PREFIX + "gang"  # the gang (multi-pod job) the pod belongs to: "train-42"

# Written by kelvin
GPU_ASSIGNED = PREFIX + "gpu-assigned"  # GPU indices chosen at bind: "0,1"
GPU_ASSIGNED_NODE = PREFIX + "gpu-assigned-node"
# when the extender bound the pod, RFC 3339 UTC with nanoseconds: "2026-12-01T04:00:00.123456789Z"
GPU_ASSIGNED_AT = PREFIX + "gpu-assigned-at"
# GPU indices `kelvin device-plugin` handed to each container so far, ";" between containers: "0;0,1"
GPU_ALLOCATED = PREFIX + "gpu-allocated"
CHECKPOINT_REQUESTED = PREFIX + "checkpoint-requested"
GANG_PLANNED_NODE = PREFIX + "gang-planned-node"  # the node the gang planner chose for this member
GANG_PLANNED_GPUS = PREFIX + "gang-planned-gpus"  # the GPU indices it chose there: "0,1,2,3"
GANG_SCHEDULING_GATE = PREFIX + "gang"  # spec.schedulingGates name held until the whole gang is planned

# Node taint written by the operator
THERMAL_TAINT_KEY = PREFIX + "thermal"
THERMAL_TAINT_VALUE = "hot"

# Node label or annotation saying the node runs CUDA MPS with enforced limits
MPS_LABEL = PREFIX + "mps"

TOPOLOGY_VALUES = ("nvlink-required", "nvlink-preferred", "any")
