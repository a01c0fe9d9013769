"""GPU-aware preemption: which lower-priority pods to evict so that a GPU pod fits a node (pure; no I/O).

* :mod:`.victims`: the candidates (a pod on the node, the GPUs it holds, its priority, PDB, checkpoint and gang facts)
  and the units they are evicted in (a pod, or every member of its gang);
* :mod:`.overlay`: a node's row of the fleet with some victims' GPUs released, many variants at once;
* :mod:`.choice`: the cheapest set of units whose release lets the preemptor pass kelvin's filters.

The extender's ``preempt`` verb (``scheduler_plugin.extender.preempt``) and the simulator's priority scenario
(``scheduler_plugin.simulator.preemption``) both call :func:`.choice.choose_victims`.
"""

from .choice import EXACT_MAX_UNITS, Choice, choose_victims
from .victims import Candidate, GangCost, Unit, build_units, gang_costs

__all__ = [
    "EXACT_MAX_UNITS",
    "Candidate",
    "Choice",
    "GangCost",
    "Unit",
    "build_units",
    "choose_victims",
    "gang_costs",
]
