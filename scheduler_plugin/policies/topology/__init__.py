"""Topology: keep multi-GPU pods on well-connected GPUs, and single-GPU pods off well-connected free groups.

Two GPUs of a node are linked at one of four levels, best first: NVLink, the same PCIe switch, the same NUMA node,
across sockets. Each level has a quality in 0..1 (args). A set of GPUs has quality
``share * worst_pair + (1 - share) * mean_pair`` (an all-reduce runs at the speed of its slowest link; the mean breaks
ties). For a node and a mask of usable GPUs, ``best(k)`` is the best quality of any ``k`` of them.

* multi-GPU pods (k >= 2): raw = ``best(k)`` over the GPUs the pod could get (absolute, 0..1);
* single-GPU pods: what matters is connectivity *quality*, not GPU count (keeping large nodes whole for large pods
  is the fragmentation policy's job, which knows the workload's shapes). Taking wholly free GPU j out of the free
  set m costs, in 0..1 (zero on a GPU already shared):

  - half the *link premium* of j: its best link to another free GPU above the node's weakest link
    (``max_i q(j, i) - floor``), i.e. the NVLink or PCIe-switch partner it would leave alone;
  - half the quality the GPUs left lose for every group size they can still host,
    ``sum_{k=2}^{|m|-1} (k/G) * (best_m(k) - best_{m-j}(k))``, over its maximum ``sum_{k=2}^{G-1} k/G``.

  Raw = ``1 - min_j loss``. A node whose GPUs are uniformly connected (all NVLink, or no NVLink or switch data, as in
  a trace) costs nothing whatever its size, so 1-GPU pods are not pushed onto 8-GPU nodes by this score; on a node
  of NVLink pairs the GPU whose partner is busy is free of charge, and an intact pair costs its premium.

Nodes share a handful of wiring patterns, so everything is tabulated once per pattern over all ``2^G`` masks
(G <= 16) and looked up by (pattern, mask) per request; wider nodes fall back to cached enumeration per distinct
(pattern, mask), exact up to ``EXACT_COMBINATIONS`` subsets and greedy beyond. The same tables answer the fit
filter's "are there k eligible GPUs all linked by NVLink" question.

The package: :mod:`.tables` (link levels, set quality, the wiring patterns and their tables, per fleet in the
snapshot index), :mod:`.plugin` (the arguments and the ``topology`` score and picker).
"""

from .plugin import TopologyArgs, TopologyPicker, TopologyScore
from .tables import (
    EXACT_COMBINATIONS,
    LEVEL_NAMES,
    MAX_TABLE_GPUS,
    TOPOLOGY,
    WIRING_COLUMNS,
    FleetTopology,
    Pattern,
    TopologyTables,
    best_set,
    greedy_chain,
    link_levels,
    set_quality,
)

__all__ = [
    "EXACT_COMBINATIONS",
    "LEVEL_NAMES",
    "MAX_TABLE_GPUS",
    "TOPOLOGY",
    "WIRING_COLUMNS",
    "FleetTopology",
    "Pattern",
    "TopologyArgs",
    "TopologyPicker",
    "TopologyScore",
    "TopologyTables",
    "best_set",
    "greedy_chain",
    "link_levels",
    "set_quality",
]
